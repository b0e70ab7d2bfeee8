package redlock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/redis/internal/guard"
)

// Vetting the nodes.
//
// Before a node counts towards a majority, the Locker asks its server two
// things, in the pipeline of an acquire request (no extra round trip): its
// maxmemory-policy (CONFIG GET, else INFO memory; anything but noeviction is
// refused, as the redis package refuses it: see ErrEvictionPolicy) and what
// server it is (INFO server's run_id, else a random identity kept under a
// key of the prefix; see redis/internal/guard). Two nodes that say they are
// one server are refused for good: the Locker's every later acquire fails
// with an error naming both (a majority of names is not a majority of
// servers). The address strings are compared at New as well, but only the
// servers can tell that 127.0.0.1:6379 and localhost:6379 are one; so the
// check is made at first contact, whenever a node first answers, and New,
// which does not contact the nodes (they may be down), cannot make it.
//
// A node is asked again in the first acquire round a minute (guard.Recheck)
// after it last answered, so a policy changed later or a server that took
// another's place is noticed within a minute; a node that answered unsafe
// is asked again by every acquire.
//
// A run_id changes when its server restarts, so identities read at
// different times may differ for one server: server S answers as node 1
// with run_id X, restarts, and answers as node 2 (another name of S, down
// until then) with run_id Y. So identities are compared as read in one
// round that asks every node. A round that learns an identity that is new
// (a node's first answer) or changed, and did not ask every node, asks the
// others too (one more round trip, only then) before it counts anything;
// a node that does not answer a round that asks every node stops counting
// until it answers again. A node that answers with the identity it had
// keeps counting: if it were one server with a node that reported another
// identity since, that server would have gone back to an earlier run_id,
// and a restart draws a new one. A round that asks every node is the
// Locker's first, and then one a minute, since the nodes were all last
// asked together. What is left is a restart of one server in the
// microseconds between two of its names being asked in one round; the next
// round that asks them (within a minute) finds them equal.

// nodeVet is what the Locker knows of one node's server.
type nodeVet struct {
	id      string    // what the server says it is (guard.Vetting.ID); "" when it will not say
	known   bool      // it answered once with a safe policy
	counted bool      // its grants and renewals count (see above)
	at      time.Time // when it last answered with a safe policy
}

type vetter struct {
	mu    sync.Mutex
	nodes []nodeVet
	full  bool  // the next acquire round asks every node
	dup   error // two nodes are one server: every acquire refuses
}

// vetPlan is which nodes a round asks.
type vetPlan struct {
	ask  []bool
	full bool // every node
}

// plan returns the nodes the next acquire round asks, or the error of two
// nodes found to be one server.
func (v *vetter) plan() (vetPlan, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dup != nil {
		return vetPlan{}, v.dup
	}
	p := vetPlan{ask: make([]bool, len(v.nodes)), full: true}
	for i, n := range v.nodes {
		p.ask[i] = v.full || !n.counted || time.Since(n.at) >= guard.Recheck
		p.full = p.full && p.ask[i]
	}
	return p, nil
}

// vetAnswer is one node's answer to the round's questions.
type vetAnswer struct {
	asked bool
	ok    bool // it answered
	vet   guard.Vetting
}

// learns reports whether answers carry an identity that is new or changed.
func (v *vetter) learns(answers []vetAnswer) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, a := range answers {
		if a.ok && (!v.nodes[i].known || v.nodes[i].id != a.vet.ID) {
			return true
		}
	}
	return false
}

// confirm asks the nodes the round did not ask (see above), and adds their
// answers: the round then asked every node. It waits at most the node
// timeout; a node that does not answer stops counting.
func (l *Locker) confirm(ctx context.Context, p *vetPlan, answers []vetAnswer, tm timing) error {
	var others []int
	for i, asked := range p.ask {
		if !asked {
			others = append(others, i)
		}
	}
	res, err := fanout(l, ctx, ctx, l.closing, others, tm.nodeTimeout,
		func(ctx context.Context, _ int, c goredis.UniversalClient) (guard.Vetting, error) {
			return runVet(ctx, c, !l.cfg.AllowEviction, l.idKey())
		}, nil, nil)
	if err != nil {
		return err
	}
	for _, i := range others {
		p.ask[i] = true
		answers[i] = vetAnswer{asked: true, ok: res.ok(i), vet: res.v[i]}
	}
	p.full = true
	return nil
}

// updateVet records a round's answers (those of p's nodes) and reports the
// nodes whose grants count, or the round's refusal: a node with an evicting
// policy (when the policy is checked), two nodes that are one server.
func (l *Locker) updateVet(p vetPlan, answers []vetAnswer) ([]bool, error) {
	v := &l.vet
	v.mu.Lock()
	defer v.mu.Unlock()
	var unsafe []error
	if p.full {
		v.full = false
	}
	for i, a := range answers {
		n := &v.nodes[i]
		switch {
		case !a.asked:
			continue
		case !a.ok:
			if p.full {
				n.counted = false // not compared with the others' identities of now
			}
			continue
		}
		if !l.cfg.AllowEviction {
			if err := guard.PolicyError(a.vet.Policy, l.addrs[i]); err != nil {
				unsafe = append(unsafe, err)
				continue
			}
		}
		changed := !n.known || n.id != a.vet.ID
		switch {
		case p.full || !changed:
			n.counted = true
		default:
			// Learnt in a round that could not ask every node (its
			// context ended first): the next round does.
			n.counted = false
			v.full = true
		}
		n.id, n.known, n.at = a.vet.ID, true, time.Now()
	}
	if err := v.findDup(l.addrs); err != nil {
		v.dup = err
		return nil, err
	}
	if len(unsafe) > 0 {
		return nil, unsafe[0]
	}
	counts := make([]bool, len(v.nodes))
	for i, n := range v.nodes {
		counts[i] = n.counted
	}
	return counts, nil
}

// findDup reports two nodes whose servers said they are one: equal
// identities are one server, however long ago each was read.
func (v *vetter) findDup(addrs []string) error {
	seen := map[string]int{}
	for i, n := range v.nodes {
		if !n.known || n.id == "" {
			continue
		}
		if j, ok := seen[n.id]; ok {
			what := "run_id " + strings.TrimPrefix(n.id, "run_id:")
			if strings.HasPrefix(n.id, "key:") {
				what = "the same identity key"
			}
			return fmt.Errorf("%w: redlock: %s and %s are one Redis server (it reports %s under both names): a majority must be of distinct servers; list each server once", locker.ErrUnsafeConfig, addrs[j], addrs[i], what)
		}
		seen[n.id] = i
	}
	return nil
}

// distinct counts the servers among nodes whose answers count, one per
// identity.
func (v *vetter) distinct(nodes []int) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	seen := map[string]bool{}
	count := 0
	for _, i := range nodes {
		n := v.nodes[i]
		if !n.counted {
			continue
		}
		if n.id != "" {
			if seen[n.id] {
				continue
			}
			seen[n.id] = true
		}
		count++
	}
	return count
}

// idKey is the key under which a node that will not say its run_id keeps
// the random identity of its server (see redis/internal/guard).
func (l *Locker) idKey() string { return l.cfg.Prefix + "node-id" }

// runAcquireVetted is runAcquire with the node's policy and identity read
// in the same pipeline (grant.vet; nil when they could not be read, and
// then the error says why), and the acquire script run as runScript runs
// it: by its hash where the node is known to have it, else by its text.
func runAcquireVetted(ctx context.Context, c goredis.UniversalClient, k keys, owner string, ttl time.Duration, q *queued, prefer int, policy bool, idKey string) (grant, error) {
	script, ks, args, reply := famAcquireScript, k.famKeys(), famArgsAcquire(k, owner, ttl, q, prefer), famAcquireReply
	pipe := c.Pipeline()
	pr := guard.AddProbe(ctx, pipe, policy)
	st := scriptsOf(ctx)
	byHash := st.cached(script)
	var ev *goredis.Cmd
	if byHash {
		ev = script.EvalSha(ctx, pipe, ks, args...)
	} else {
		ev = script.Eval(ctx, pipe, ks, args...)
	}
	_, _ = pipe.Exec(ctx)
	vet, verr := pr.Result(ctx, c, idKey)
	if !byHash {
		st.ran(script, ev)
	}
	v, err := ev.Slice()
	if byHash && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		st.lost()
		v, err = runScript(ctx, c, script, ks, args...).Slice()
	}
	g, err := reply(k, v, err)
	switch {
	case verr == nil:
		g.vet = &vet
	case err == nil:
		err = verr // a grant not counted is cleaned up as a failed node's
	}
	return g, err
}

// runVet reads the node's policy and identity (for confirm).
func runVet(ctx context.Context, c goredis.UniversalClient, policy bool, idKey string) (guard.Vetting, error) {
	pipe := c.Pipeline()
	pr := guard.AddProbe(ctx, pipe, policy)
	_, _ = pipe.Exec(ctx)
	return pr.Result(ctx, c, idKey)
}
