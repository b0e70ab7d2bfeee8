package redlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// Every round sends one request to each node it concerns, each on a
// goroutine of its own, and waits for the answers at most the node timeout,
// and no longer than the caller's context and the Locker allow. go-redis
// cannot abort a request in flight; a request the round stopped waiting for
// finishes in the background (its context has the node timeout as its
// deadline, which reaches the socket when the client has
// ContextTimeoutEnabled, as Open's clients do), and what it did on the node
// is handed to the round's late function, so that a grant that arrived too
// late is deleted again.

// noAnswerError is the error of a node that did not answer within the node
// timeout. It wraps os.ErrDeadlineExceeded, as a go-redis socket timeout
// does.
// detail, if set, is the text of the request's own error (kept as text
// only: see nodeErr).
type noAnswerError struct {
	timeout time.Duration
	detail  string
}

func (e noAnswerError) Error() string {
	if e.detail != "" {
		return fmt.Sprintf("no answer within the node timeout of %v (%s)", e.timeout, e.detail)
	}
	return fmt.Sprintf("no answer within the node timeout of %v", e.timeout)
}
func (e noAnswerError) Unwrap() error { return os.ErrDeadlineExceeded }

// nodeErr turns a context error of one node's request into noAnswerError
// while base (the caller's context, or none) has not ended: the request's
// own deadline (the node timeout) or a go-redis internal timeout ran out,
// not the caller's context, and errors.Is(err, context.DeadlineExceeded)
// must hold only when the caller's context ended (a caller tells "my
// deadline passed" from "the nodes failed" by it).
func nodeErr(err error, base context.Context, timeout time.Duration) error {
	if err == nil || base.Err() != nil {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return noAnswerError{timeout, err.Error()}
	}
	return err
}

// answer is one node's reply in a round.
type answer[T any] struct {
	node int
	v    T
	err  error
}

// outcome is what a round learnt from each node: answered[i] false means
// the node was not asked or did not answer in time (err[i] says which).
type outcome[T any] struct {
	v        []T
	err      []error
	answered []bool
}

// fanout sends call to each node in nodes, each request under a context
// derived from base with the node timeout, and collects the answers until
// all came, the node timeout passed, wait ended (an error wrapping its
// ctx.Err() and its cause, or locker.ErrClosed: see Life.Why) or life
// ended (locker.ErrClosed). late, if not nil, is given
// every answer that came after the round stopped waiting for it, on that
// request's goroutine (which the Locker counts as active), with the
// request's own error (see nodeErr for what the round's outcome gets).
//
// decided, if not nil, is asked after each answer whether the round's
// outcome is settled (a majority renewed, say); fanout then stops waiting
// for the rest, whose answers go to late.
func fanout[T any](l *Locker, wait, base context.Context, life <-chan struct{}, nodes []int, timeout time.Duration,
	call func(ctx context.Context, node int, c goredis.UniversalClient) (T, error), late func(node int, v T, err error),
	decided func(outcome[T]) bool) (outcome[T], error) {
	return fanoutSettle(l, wait, base, life, nodes, timeout, call, late, decided, false)
}

// minSettle is the least time fanoutSettle waits for the rest of the
// answers once the outcome is decided.
const minSettle = time.Millisecond

// fanoutSettle is fanout; with settle, a decided outcome still waits for
// the rest of the answers as long again as the decided ones took (at least
// minSettle, within the node timeout). The grant round settles: a refused
// round must clean up on every node that may have granted (mayHold), and
// the answers still in flight when a majority refused mostly come within
// that time, most often refusals, which need no clean-up. Waiting for them
// costs less than the clean-up's round trip it saves (issue 32: that
// clean-up was a tenth of a contended acquisition's requests). A decided
// outcome stands: the end of wait or of life while it settles only ends
// the settling, as the timer does.
func fanoutSettle[T any](l *Locker, wait, base context.Context, life <-chan struct{}, nodes []int, timeout time.Duration,
	call func(ctx context.Context, node int, c goredis.UniversalClient) (T, error), late func(node int, v T, err error),
	decided func(outcome[T]) bool, settle bool) (outcome[T], error) {
	start := time.Now()
	n := len(l.clients)
	out := outcome[T]{v: make([]T, n), err: make([]error, n), answered: make([]bool, n)}
	var (
		mu      sync.Mutex
		stopped bool
		ch      = make(chan answer[T], len(nodes))
	)
	wait4 := timeout
	for _, i := range nodes {
		dial, waited := l.dialAllowance(i)
		t := timeout + dial
		if waited {
			wait4 = max(wait4, t)
			out.err[i] = noAnswerError{timeout: t}
		} else {
			out.err[i] = noAnswerError{timeout: timeout}
		}
		req := func() {
			rctx, cancel := context.WithTimeout(base, t)
			v, err := call(withScripts(rctx, &l.scripts[i]), i, l.clients[i])
			cancel()
			l.down[i].Store(err != nil && !errors.Is(err, goredis.Nil) && rctx.Err() != nil && base.Err() == nil)
			mu.Lock()
			s := stopped
			if !s {
				ch <- answer[T]{i, v, nodeErr(err, base, t)}
			}
			mu.Unlock()
			if s && late != nil {
				late(i, v, err)
			}
		}
		if !l.life.Reuse(req) {
			// Close has stopped waiting: this is a request of a round
			// Close gave up on, which may outlive Close (see Close), and
			// what it deletes must still be deleted.
			req()
		}
	}
	stop := func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		for {
			select {
			case a := <-ch:
				out.v[a.node], out.err[a.node], out.answered[a.node] = a.v, a.err, true
			default:
				return
			}
		}
	}
	timer := time.NewTimer(wait4)
	defer timer.Stop()
	settling := false
	for pending := len(nodes); pending > 0; pending-- {
		select {
		case a := <-ch:
			out.v[a.node], out.err[a.node], out.answered[a.node] = a.v, a.err, true
			if !settling && decided != nil && pending > 1 && decided(out) {
				if !settle {
					stop()
					return out, nil
				}
				settling = true
				took := time.Since(start)
				if left := wait4 - took; left > 0 {
					timer.Reset(min(max(took, minSettle), left))
				}
			}
		case <-timer.C:
			stop()
			return out, nil
		case <-wait.Done():
			stop()
			if settling {
				return out, nil // decided: the end of the wait only ends the settling
			}
			return out, l.life.Why(wait, nil)
		case <-life:
			stop()
			if settling {
				return out, nil
			}
			return out, locker.ErrClosed
		}
	}
	return out, nil
}

// maxDialAllowance bounds the extra time given to a node with no open
// connection (see dialAllowance).
const maxDialAllowance = time.Second

// dialAllowance is the extra time a request to node i gets when it must
// dial first, which the node timeout does not allow for (a loaded client,
// or a fresh process, would otherwise count every live node as down on its
// first round; and several requests at once, each needing a connection of
// its own, would count it down on the next ones), and whether the round
// waits for it: the client's DialTimeout, at most maxDialAllowance, when
// the client's pool has no idle connection (or at the Locker's first
// request to the node). The validity check counts the time spent, so
// safety does not depend on it.
//
// A node whose last request ran out of time (down) gets it too, but the
// round does not wait for it: a node that is gone costs each round the
// node timeout only, and a node that lost its connections on a link whose
// round trip is over a third of the node timeout (the handshake's round
// trips and the request's do not fit in it) still makes its connection,
// whose answer comes late (see fanout's late), so that the next round
// finds it and fits. Without that such a node stayed down for good.
func (l *Locker) dialAllowance(i int) (time.Duration, bool) {
	c, ok := l.clients[i].(*goredis.Client)
	first := !l.contacted[i].Swap(true)
	switch {
	case !ok:
		return 0, true
	case first:
	case c.PoolStats().IdleConns > 0:
		return 0, true
	}
	return min(c.Options().DialTimeout, maxDialAllowance), !l.down[i].Load()
}

// ok reports whether node i answered without error.
func (o outcome[T]) ok(i int) bool { return o.answered[i] && o.err[i] == nil }
