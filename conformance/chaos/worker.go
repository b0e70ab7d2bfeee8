package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// A worker loops: take a random key of the run, write to the register
// under it a few times with its fencing token (some holds last longer than
// the TTL, so renewal is exercised), read it back, release. It records
// every operation as an event with its invocation and completion times
// (Unix nanoseconds: the workers share the machine's clock). It writes
// whatever happens, also after its lock was lost: fencing must reject what
// the lock no longer covers, and the checks must see it.

// event is one recorded operation.
type event struct {
	W     int    `json:"w"`
	Op    string `json:"op"` // opAcquire, opWrite, opRead, opLeave, opLost, opRelease
	Seq   int    `json:"seq"`
	Key   string `json:"key"`
	Inv   int64  `json:"inv"`
	Done  int64  `json:"done"`
	Tok   int64  `json:"tok,omitempty"`
	Val   int64  `json:"val,omitempty"`
	Fence int64  `json:"fence,omitempty"` // what a read returned
	OK    bool   `json:"ok,omitempty"`    // the operation succeeded (a write: accepted; a reader-writer read: served)
	Err   string `json:"err,omitempty"`
	Lost  bool   `json:"lost,omitempty"`  // the error wraps locker.ErrLost; for a write or a read: the handle had reported the loss when it began
	Stuck bool   `json:"stuck,omitempty"` // a release after which Done did not close
	Mode  string `json:"mode,omitempty"`  // an acquisition of a family: modeRead, modeWrite, modePermit

	// A semaphore's write: what the register did (see register.semWrite).
	Evicted int64   `json:"evicted,omitempty"` // the writer it cut off to accept this one
	Full    []int64 `json:"full,omitempty"`    // the n writers it found writing (an eviction, or a refusal for that)
	Floor   int64   `json:"floor,omitempty"`   // the floor it refused the write below
}

// Prefixes of Acquire errors, by which the report counts them.
const (
	errStopped  = "stopped"  // the run ended the wait
	errDeadline = "deadline" // the worker's own bound: 3 TTL + 2s
	errClosed   = "closed"   // the Locker was closed under the call
	errBackend  = "backend"  // any other: the backend failed the call (unreachable, ...)
)

const (
	opAcquire = "acquire"
	opWrite   = "write"
	opRead    = "read"
	opLeave   = "leave" // a semaphore's holder leaves the register's writers
	opLost    = "lost"
	opRelease = "release"
)

func now() int64 { return time.Now().UnixNano() }

// workConfig is what a worker needs to know of the run.
type workConfig struct {
	index  int
	run    string // prefix of the run's keys
	keys   int
	ttl    time.Duration
	seed   uint64
	family Family
}

func (c workConfig) key(i int) string { return fmt.Sprintf("chaos/%s/k%d", c.run, i) }

// work runs one worker until ctx ends (then it finishes its hold, releasing
// the lock, and returns).
// The family's views of l are vs (see Family.views).
func work(ctx context.Context, vs views, reg *register, c workConfig, emit func(event)) {
	rng := rand.New(rand.NewPCG(c.seed, uint64(c.index)+1))
	for seq := 0; ctx.Err() == nil; seq++ {
		key := c.key(rng.IntN(c.keys))
		l, mode := vs.lock, vs.mode
		if c.family.kind == rwFamily {
			// One hold in four is a writer's.
			l, mode = vs.read, modeRead
			if rng.IntN(4) == 0 {
				l, mode = vs.write, modeWrite
			}
		}
		ev := event{W: c.index, Op: opAcquire, Seq: seq, Key: key, Mode: mode, Inv: now()}
		actx, cancel := context.WithTimeout(ctx, 3*c.ttl+2*time.Second)
		h, err := l.Acquire(actx, key, locker.WithTTL(c.ttl))
		cancel()
		ev.Done = now()
		if err != nil {
			ev.Err = err.Error()
			switch {
			case ctx.Err() != nil:
				ev.Err = errStopped + ": " + ev.Err
			case errors.Is(err, context.DeadlineExceeded):
				ev.Err = errDeadline + ": " + ev.Err
			case errors.Is(err, locker.ErrClosed):
				ev.Err = errClosed + ": " + ev.Err
			default:
				ev.Err = errBackend + ": " + ev.Err
			}
			emit(ev)
			if ctx.Err() != nil {
				return
			}
			pause(ctx, time.Duration(rng.IntN(50))*time.Millisecond)
			continue
		}
		ev.OK, ev.Tok = true, h.Token()
		emit(ev)
		hold(ctx, rng, reg, c, h, seq, mode, emit)
	}
}

// hold uses and releases one acquired lock: the mutex's holder writes 1–3
// times and reads; a semaphore's writes 1–3 times and leaves the writers; a
// reader reads 1–3 times; a writer writes 1–3 times and reads.
func hold(ctx context.Context, rng *rand.Rand, reg *register, c workConfig, h locker.Handle, seq int, mode string, emit func(event)) {
	key, tok := h.Key(), h.Token()
	// Done closes on a loss, and at the latest when Release returns (the
	// contract: Release ends the hold whatever happens).
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-h.Done()
		at := now()
		// Done also closes when our Release ends the hold (Err then wraps
		// ErrReleased): only a loss is an event.
		if err := h.Err(); errors.Is(err, locker.ErrLost) {
			emit(event{W: c.index, Op: opLost, Seq: seq, Key: key, Tok: tok, Inv: at, Done: at, Err: err.Error(), Lost: true})
		}
	}()

	// Mostly short holds; a quarter last one to two TTLs, so that the lock
	// must be renewed while it is used.
	d := time.Duration(rng.Int64N(int64(c.ttl / 5)))
	if rng.IntN(4) == 0 {
		d = c.ttl + time.Duration(rng.Int64N(int64(c.ttl)))
	}
	n := 1 + rng.IntN(3)
	for i := range n {
		pause(ctx, d/time.Duration(n))
		val := int64(c.index)<<40 | int64(seq)<<8 | int64(i)
		if mode == modeRead {
			emit(rwReadEvent(reg, c, key, tok, seq, h))
			continue
		}
		ev := event{W: c.index, Op: opWrite, Seq: seq, Key: key, Tok: tok, Val: val, Lost: h.Err() != nil, Inv: now()}
		wctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		var ok bool
		var err error
		switch mode {
		case modePermit:
			var res semResult
			res, err = reg.semWrite(wctx, key, c.family.n, tok, val)
			ok, ev.Evicted, ev.Full, ev.Floor = res.ok, res.evicted, res.full, res.floor
		case modeWrite:
			ok, err = reg.rwWrite(wctx, key, tok, val)
		default:
			ok, err = reg.write(wctx, key, tok, val)
		}
		cancel()
		ev.Done, ev.OK = now(), ok
		if err != nil {
			ev.Err = err.Error()
		}
		emit(ev)
	}
	switch mode {
	case modePermit:
		ev := event{W: c.index, Op: opLeave, Seq: seq, Key: key, Tok: tok, Inv: now()}
		lctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		err := reg.semLeave(lctx, key, tok)
		cancel()
		ev.Done, ev.OK = now(), err == nil
		if err != nil {
			ev.Err = err.Error()
		}
		emit(ev)
	case modeWrite:
		emit(rwReadEvent(reg, c, key, tok, seq, h))
	case modeRead:
	default:
		ev := event{W: c.index, Op: opRead, Seq: seq, Key: key, Tok: tok, Inv: now()}
		rctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		fence, val, err := reg.read(rctx, key)
		cancel()
		ev.Done, ev.Fence, ev.Val, ev.OK = now(), fence, val, err == nil
		if err != nil {
			ev.Err = err.Error()
		}
		emit(ev)
	}

	ev := event{W: c.index, Op: opRelease, Seq: seq, Key: key, Tok: tok, Inv: now()}
	rctx, cancel := context.WithTimeout(context.Background(), 2*c.ttl+5*time.Second)
	err := h.Release(rctx)
	cancel()
	ev.Done, ev.OK = now(), err == nil
	if err != nil {
		ev.Err, ev.Lost = err.Error(), errors.Is(err, locker.ErrLost)
	}
	t := time.NewTimer(10 * time.Second)
	select {
	case <-watched:
		t.Stop()
	case <-t.C:
		ev.Err += " (and Done was still open 10s after Release returned)"
		ev.Stuck = true
	}
	emit(ev)
}

// rwReadEvent reads the reader-writer register with the hold's token: OK
// when the read was served (Fence and Val are then what it returned), not
// OK with no Err when it was refused.
func rwReadEvent(reg *register, c workConfig, key string, tok int64, seq int, h locker.Handle) event {
	ev := event{W: c.index, Op: opRead, Seq: seq, Key: key, Tok: tok, Lost: h.Err() != nil, Inv: now()}
	rctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	ok, fence, val, err := reg.rwRead(rctx, key, tok)
	cancel()
	ev.Done, ev.OK, ev.Fence, ev.Val = now(), ok, fence, val
	if err != nil {
		ev.Err = err.Error()
	}
	return ev
}

// pause sleeps for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Worker processes: the test binary run again with -test.run selecting the
// test that called Run; there Run finds these variables and works instead.
const (
	envWorker   = "LOCKER_CHAOS_WORKER"
	envRun      = "LOCKER_CHAOS_RUN" // the test's name
	envRunID    = "LOCKER_CHAOS_RUN_ID"
	envRegister = "LOCKER_CHAOS_REGISTER"
	envKeys     = "LOCKER_CHAOS_KEYS"
	envTTL      = "LOCKER_CHAOS_TTL"
	envSeed     = "LOCKER_CHAOS_WORKER_SEED"
	envFamily   = "LOCKER_CHAOS_FAMILY"

	eventPrefix = "locker-chaos-event "
	readyLine   = "locker-chaos-ready"
)

func isWorkerProcess(t *testing.T) bool {
	return os.Getenv(envWorker) != "" && os.Getenv(envRun) == t.Name()
}

// runWorkerProcess is Run in a worker process: work until stdin closes,
// printing events on stdout.
func runWorkerProcess(t *testing.T, h Harness) {
	c := workConfig{run: os.Getenv(envRunID)}
	var err error
	if c.index, err = strconv.Atoi(os.Getenv(envWorker)); err != nil {
		t.Fatalf("chaos worker: %s: %v", envWorker, err)
	}
	if c.keys, err = strconv.Atoi(os.Getenv(envKeys)); err != nil {
		t.Fatalf("chaos worker: %s: %v", envKeys, err)
	}
	if c.ttl, err = time.ParseDuration(os.Getenv(envTTL)); err != nil {
		t.Fatalf("chaos worker: %s: %v", envTTL, err)
	}
	if c.seed, err = strconv.ParseUint(os.Getenv(envSeed), 10, 64); err != nil {
		t.Fatalf("chaos worker: %s: %v", envSeed, err)
	}
	if c.family, err = parseFamily(os.Getenv(envFamily)); err != nil {
		t.Fatalf("chaos worker: %s: %v", envFamily, err)
	}
	reg, err := openRegister(os.Getenv(envRegister))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.close()
	l := h.NewLocker(t, Worker{Index: c.index, Env: os.Getenv})
	defer l.Close()
	vs, err := c.family.views(l)
	if err != nil {
		t.Fatal(err) // the parent reports the output of a worker that never got ready
	}

	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	emit := func(e event) {
		b, _ := json.Marshal(e)
		mu.Lock()
		defer mu.Unlock()
		_, _ = out.WriteString(eventPrefix)
		_, _ = out.Write(b)
		_ = out.WriteByte('\n')
		_ = out.Flush()
	}
	fmt.Println(readyLine)

	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop us
		stop()
	}()
	work(ctx, vs, reg, c, emit)
}
