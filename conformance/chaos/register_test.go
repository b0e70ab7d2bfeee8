package chaos

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// TestSemRegisterMatchesModel: the SQLite semaphore register does what its
// model (semStep, which the checks replay) says, over random writes and
// leaves of a few tokens.
func TestSemRegisterMatchesModel(t *testing.T) {
	reg, err := openRegister(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.close()
	ctx := context.Background()
	const n = 3
	rng := rand.New(rand.NewPCG(1, 2))
	var s semState
	evictions, refusals := 0, 0
	for i := range 600 {
		tok := 1 + int64(i/4) + rng.Int64N(6) // mostly rising, with stragglers
		if rng.IntN(4) == 0 {
			if err := reg.semLeave(ctx, "k", tok); err != nil {
				t.Fatal(err)
			}
			s = s.without(tok)
			continue
		}
		got, err := reg.semWrite(ctx, "k", n, tok, int64(i))
		if err != nil {
			t.Fatal(err)
		}
		want, next := semStep(n, s, tok)
		var full [maxSemaphore]int64
		copy(full[:], got.full)
		if got.ok != want.ok || got.evicted != want.evicted || full != want.full || got.floor != want.floor {
			t.Fatalf("write %d of token %d on %+v: register %+v, model %+v", i, tok, s, got, want)
		}
		if got.evicted != 0 {
			evictions++
		}
		if !got.ok {
			refusals++
		}
		s = next
		if s.k > n {
			t.Fatalf("the model holds %d writers", s.k)
		}
	}
	if evictions == 0 || refusals == 0 {
		t.Errorf("the sequence exercised too little: %d evictions, %d refusals", evictions, refusals)
	}
}

// TestRWRegister: a writer older than a read or a write already served is
// refused; a reader older than the last write is refused; others are
// served what was last written.
func TestRWRegister(t *testing.T) {
	reg, err := openRegister(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.close()
	ctx := context.Background()
	type op struct {
		write      bool
		tok, val   int64
		ok         bool
		fence, got int64 // a read's answer
	}
	for i, o := range []op{
		{tok: 1, ok: true},                       // never written: zeros
		{write: true, tok: 2, val: 20, ok: true}, // above the read
		{write: true, tok: 2, val: 21, ok: true}, // the same writer again
		{tok: 3, ok: true, fence: 2, got: 21},    // a newer reader
		{tok: 2, ok: true, fence: 2, got: 21},    // the writer reads its own
		{write: true, tok: 2, val: 22},           // older than reader 3
		{tok: 4, ok: true, fence: 2, got: 21},    // readers share
		{write: true, tok: 5, val: 50, ok: true}, // a newer writer
		{tok: 4},                                 // reader 4 is older than it
		{tok: 6, ok: true, fence: 5, got: 50},    // a newer reader
		{write: true, tok: 5, val: 51},           // older than reader 6
		{write: true, tok: 7, val: 70, ok: true}, // newer than everything
	} {
		if o.write {
			ok, err := reg.rwWrite(ctx, "k", o.tok, o.val)
			if err != nil || ok != o.ok {
				t.Errorf("op %d: write(%d, %d) = %v, %v; want %v", i, o.tok, o.val, ok, err, o.ok)
			}
			continue
		}
		ok, fence, got, err := reg.rwRead(ctx, "k", o.tok)
		if err != nil || ok != o.ok || fence != o.fence || got != o.got {
			t.Errorf("op %d: read(%d) = %v, %d, %d, %v; want %v, %d, %d", i, o.tok, ok, fence, got, err, o.ok, o.fence, o.got)
		}
	}
}
