package testserver

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// LogRecorder is a slog.Handler that keeps every record, for tests of a
// backend's WithLogger events. Its methods are safe for concurrent use.
type LogRecorder struct {
	mu    sync.Mutex
	recs  []string
	attrs []slog.Attr
	added chan struct{} // closed at the next record
	root  *LogRecorder  // where a WithAttrs handler records; nil: r itself
}

// Logger returns a logger that records into r, at every level.
func (r *LogRecorder) Logger() *slog.Logger { return slog.New(r) }

func (r *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", rec.Level, rec.Message)
	for _, a := range r.attrs {
		fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
	}
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%q", a.Key, a.Value.String())
		return true
	})
	root := r
	if r.root != nil {
		root = r.root
	}
	root.mu.Lock()
	root.recs = append(root.recs, b.String())
	if root.added != nil {
		close(root.added)
		root.added = nil
	}
	root.mu.Unlock()
	return nil
}

func (r *LogRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	r.mu.Lock()
	defer r.mu.Unlock()
	root := r
	if r.root != nil {
		root = r.root
	}
	return &LogRecorder{attrs: append(append([]slog.Attr(nil), r.attrs...), attrs...), root: root}
}

func (r *LogRecorder) WithGroup(string) slog.Handler { return r }

// Records returns the records so far, each as "LEVEL message k="v" ...".
func (r *LogRecorder) Records() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.recs...)
}

// WaitFor waits until a record contains every one of parts, failing t
// after within.
func (r *LogRecorder) WaitFor(t testing.TB, within time.Duration, parts ...string) {
	t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		r.mu.Lock()
		if r.added == nil {
			r.added = make(chan struct{})
		}
		added := r.added
		recs := append([]string(nil), r.recs...)
		r.mu.Unlock()
		if has(recs, parts) {
			return
		}
		select {
		case <-added:
		case <-timeout.C:
			t.Fatalf("no log record with %q within %v among:\n  %s", parts, within, strings.Join(recs, "\n  "))
		}
	}
}

func has(recs, parts []string) bool {
next:
	for _, rec := range recs {
		for _, p := range parts {
			if !strings.Contains(rec, p) {
				continue next
			}
		}
		return true
	}
	return false
}

// Want fails t unless a record so far contains every one of parts.
func (r *LogRecorder) Want(t testing.TB, parts ...string) {
	t.Helper()
	recs := r.Records()
	if has(recs, parts) {
		return
	}
	t.Errorf("no log record with %q among:\n  %s", parts, strings.Join(recs, "\n  "))
}

// WantNone fails t if a record so far contains s (a password, say).
func (r *LogRecorder) WantNone(t testing.TB, s string) {
	t.Helper()
	for _, rec := range r.Records() {
		if strings.Contains(rec, s) {
			t.Errorf("a log record contains %q: %s", s, rec)
		}
	}
}

// AtRiskThenCleared partitions h's holder from its servers through pxs
// (Partition), waits until h reports its lock at risk (locker.AtRisker),
// heals the partition and waits until h reports it cleared; it fails if
// the lock ends first, or either takes longer than within.
func AtRiskThenCleared(t *testing.T, h locker.Handle, within time.Duration, pxs ...*Proxy) {
	t.Helper()
	r, ok := h.(locker.AtRisker)
	if !ok {
		t.Fatalf("the Handle (%T) is not a locker.AtRisker", h)
	}
	if at, _ := r.AtRisk(); at {
		t.Fatal("at risk just after the acquisition")
	}
	for _, px := range pxs {
		px.Partition(t)
	}
	cut := time.Now()
	healed := false
	heal := func() {
		healed = true
		for _, px := range pxs {
			px.Heal(t)
		}
	}
	defer func() {
		if !healed {
			heal()
		}
	}()
	wait := func(want bool) {
		t.Helper()
		timeout := time.NewTimer(within)
		defer timeout.Stop()
		for {
			at, changed := r.AtRisk()
			if at == want {
				return
			}
			select {
			case <-changed:
			case <-h.Done():
				t.Fatalf("the lock ended (%v) before AtRisk reported %t", h.Err(), want)
			case <-timeout.C:
				t.Fatalf("AtRisk did not report %t within %v", want, within)
			}
		}
	}
	wait(true)
	t.Logf("at risk %v after the partition", time.Since(cut).Round(time.Millisecond))
	heal()
	healedAt := time.Now()
	wait(false)
	t.Logf("cleared %v after the heal", time.Since(healedAt).Round(time.Millisecond))
}
