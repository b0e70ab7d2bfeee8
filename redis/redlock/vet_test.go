package redlock

import (
	"errors"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/internal/guard"
)

func answers(ids ...string) []vetAnswer {
	out := make([]vetAnswer, len(ids))
	for i, id := range ids {
		switch id {
		case "-": // not asked
		case "x": // asked, no answer
			out[i].asked = true
		default:
			out[i] = vetAnswer{asked: true, ok: true, vet: guard.Vetting{Policy: "noeviction", ID: id}}
		}
	}
	return out
}

func vetRound(t *testing.T, l *Locker, ids ...string) ([]bool, error) {
	t.Helper()
	p, err := l.vet.plan()
	if err != nil {
		return nil, err
	}
	a := answers(ids...)
	for i := range a {
		if a[i].asked != p.ask[i] {
			t.Fatalf("round %v: node %d asked=%v, the plan says %v", ids, i+1, a[i].asked, p.ask[i])
		}
	}
	return l.updateVet(p, a)
}

// The rules of vet.go: identities are compared as read in a round that
// asks every node; a new or changed identity learnt otherwise does not
// count (the round asks the others first: Locker.confirm); equal
// identities are refused for good.
func TestVetRestartedAlias(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	// First round: every node asked; node 2 does not answer.
	counts, err := vetRound(t, l, "run_id:X", "x", "run_id:C")
	if err != nil || !counts[0] || counts[1] || !counts[2] {
		t.Fatalf("first round: %v %v", counts, err)
	}
	// Node 2 answers with another run_id (node 1's server restarted) in a
	// round that asked only it, and that could not ask the others: it
	// does not count, and the next round asks every node.
	p, _ := l.vet.plan()
	a := answers("-", "run_id:Y", "-")
	if !l.vet.learns(a) {
		t.Fatal("a node's first identity is not news")
	}
	counts, err = l.updateVet(p, a)
	if err != nil || counts[1] {
		t.Fatalf("node 2 first seen in a partial round: %v %v, want it not counted", counts, err)
	}
	if p, _ := l.vet.plan(); !p.full {
		t.Fatalf("after a new identity in a partial round the next round must ask every node: %v", p.ask)
	}
	// That round finds node 1 with the new run_id too: one server.
	_, err = vetRound(t, l, "run_id:Y", "run_id:Y", "run_id:C")
	if !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Fatalf("one server under two names: %v, want ErrUnsafeConfig", err)
	}
	if _, err := l.vet.plan(); !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Fatalf("the refusal must stay: %v", err)
	}
	if n := l.vet.distinct([]int{0, 1, 2}); n != 2 {
		t.Errorf("distinct servers among three nodes, two of them one server: %d, want 2", n)
	}
}

// A node that does not answer a round that asks every node stops counting
// until it answers again; answering with the identity it had, it counts.
func TestVetSilentInFullRound(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	if _, err := vetRound(t, l, "run_id:A", "run_id:B", "run_id:C"); err != nil {
		t.Fatal(err)
	}
	l.vet.mu.Lock()
	l.vet.full = true
	l.vet.mu.Unlock()
	counts, err := vetRound(t, l, "run_id:A", "x", "run_id:C")
	if err != nil || !counts[0] || counts[1] || !counts[2] {
		t.Fatalf("node 2 silent in a full round: %v %v, want it not counted", counts, err)
	}
	a := answers("-", "run_id:B", "-")
	if l.vet.learns(a) {
		t.Fatal("an unchanged identity is news")
	}
	counts, _ = vetRound(t, l, "-", "run_id:B", "-")
	if !counts[1] {
		t.Fatalf("node 2 back with its identity does not count")
	}
	// An unchanged identity in a recheck keeps counting.
	l.vet.mu.Lock()
	l.vet.nodes[0].at = l.vet.nodes[0].at.Add(-guard.Recheck)
	l.vet.mu.Unlock()
	counts, _ = vetRound(t, l, "run_id:A", "-", "-")
	if !counts[0] {
		t.Fatalf("node 1 rechecked, unchanged, no longer counts")
	}
}

// An evicting policy refuses the round, names the node, and is asked again.
func TestVetEvictingPolicy(t *testing.T) {
	l := New(clientsFor(t, deadAddrs(t, 3)))
	defer l.Close()
	p, _ := l.vet.plan()
	a := answers("run_id:A", "run_id:B", "run_id:C")
	a[1].vet.Policy = "allkeys-lru"
	_, err := l.updateVet(p, a)
	if !errors.Is(err, ErrEvictionPolicy) || !errors.Is(err, locker.ErrUnsafeConfig) {
		t.Fatalf("evicting node: %v", err)
	}
	if p, _ := l.vet.plan(); !p.ask[1] || p.ask[0] {
		t.Fatalf("after a refusal: ask %v, want node 2 only", p.ask)
	}
	l2 := New(clientsFor(t, deadAddrs(t, 3)), WithAllowEviction(true))
	defer l2.Close()
	p, _ = l2.vet.plan()
	if _, err := l2.updateVet(p, a); err != nil {
		t.Fatalf("WithAllowEviction: %v", err)
	}
}
