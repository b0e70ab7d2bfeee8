package observe_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/observe"
)

// startSignal is a SpanProcessor that sends each span named name on
// started when the span starts: the signal that a call has begun.
type startSignal struct {
	name    string
	started chan sdktrace.ReadWriteSpan
}

func (p startSignal) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if s.Name() == p.name {
		p.started <- s
	}
}
func (startSignal) OnEnd(sdktrace.ReadOnlySpan)      {}
func (startSignal) Shutdown(context.Context) error   { return nil }
func (startSignal) ForceFlush(context.Context) error { return nil }

// TestHandoffTrace is the trace of a contended handoff, as the in-memory
// exporter sees it: request A holds k; request B's Acquire of k begins
// while A holds it and waits; A releases; B acquires. B's locker.Acquire
// span covers the wait: it starts before A's locker.Release and ends after
// A's Release began, with a higher token. It has a span link to A's
// locker.Acquire span, in A's trace, with A's token as the link's
// locker.token: whom B waited for. An Acquire that found k free and a
// TryAcquire have no link.
func TestHandoffTrace(t *testing.T) {
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	started := make(chan sdktrace.ReadWriteSpan, 4)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithSpanProcessor(startSignal{name: "locker.Acquire", started: started}))
	l := observe.Wrap(memlock.NewStore().NewLocker(), observe.WithTracerProvider(tp))
	defer l.Close()
	tracer := tp.Tracer("test")

	// Request A: takes k.
	actx, reqA := tracer.Start(ctx, "request A")
	a, err := l.Acquire(actx, "k")
	if err != nil {
		t.Fatal(err)
	}
	<-started // A's Acquire
	// Request C: one try at k while A holds it.
	cctx, reqC := tracer.Start(ctx, "request C")
	if _, err := l.TryAcquire(cctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	reqC.End()

	// Request B: waits for k.
	bctx, reqB := tracer.Start(ctx, "request B")
	type result struct {
		h   locker.Handle
		err error
	}
	bres := make(chan result, 1)
	go func() {
		h, err := l.Acquire(bctx, "k")
		bres <- result{h, err}
	}()
	<-started // B's Acquire has begun: its span started, k held by A

	if err := a.Release(actx); err != nil {
		t.Fatal(err)
	}
	reqA.End()
	r := <-bres
	if r.err != nil {
		t.Fatalf("B: %v", r.err)
	}
	if err := r.h.Release(bctx); err != nil {
		t.Fatal(err)
	}
	reqB.End()

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range exp.GetSpans().Snapshots() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["locker.Acquire"]) != 2 || len(byName["locker.Release"]) != 2 || len(byName["locker.TryAcquire"]) != 1 {
		t.Fatalf("spans %v: want two Acquire, two Release, one TryAcquire", byName)
	}
	// The exporter has the spans in the order they ended: A's Acquire
	// before B's (B's began after A's had ended). The Releases are told
	// apart by their tokens: A's Release and B's Acquire end at about the
	// same time, in either order.
	acqA, acqB := byName["locker.Acquire"][0], byName["locker.Acquire"][1]
	relA, relB := byName["locker.Release"][0], byName["locker.Release"][1]
	if token(relA) == token(acqB) {
		relA, relB = relB, relA
	}
	try := byName["locker.TryAcquire"][0]
	for _, c := range []struct {
		s   sdktrace.ReadOnlySpan
		req string
	}{{acqA, "request A"}, {relA, "request A"}, {acqB, "request B"}, {relB, "request B"}, {try, "request C"}} {
		if p := parentName(byName, c.s); p != c.req {
			t.Errorf("%s (token %d): a child of %q, want %q", c.s.Name(), token(c.s), p, c.req)
		}
	}
	tokA, tokB := token(acqA), token(acqB)
	if tokA == 0 || tokB <= tokA || token(relA) != tokA || token(relB) != tokB {
		t.Errorf("tokens: A acquired %d, released %d; B acquired %d, released %d: want B's above A's, each Release its Acquire's",
			tokA, token(relA), tokB, token(relB))
	}
	// B's Acquire covers the wait: it began while A held k, before A's
	// Release, and ended after A's Release began.
	if !acqB.StartTime().Before(relA.StartTime()) || acqB.EndTime().Before(relA.StartTime()) {
		t.Errorf("B's Acquire %v–%v, A's Release %v–%v: want B's Acquire to begin before A's Release and end after it began",
			acqB.StartTime(), acqB.EndTime(), relA.StartTime(), relA.EndTime())
	}
	if acqB.StartTime().Before(acqA.EndTime()) {
		t.Errorf("B's Acquire began at %v, before A's Acquire ended at %v", acqB.StartTime(), acqA.EndTime())
	}
	// The link: B waited for A's lock, taken by A's Acquire span.
	links := acqB.Links()
	if len(links) != 1 {
		t.Fatalf("B's Acquire has %d links, want 1 (to A's Acquire)", len(links))
	}
	if links[0].SpanContext.SpanID() != acqA.SpanContext().SpanID() || links[0].SpanContext.TraceID() != acqA.SpanContext().TraceID() {
		t.Errorf("B's Acquire links to %v, want A's Acquire %v", links[0].SpanContext, acqA.SpanContext())
	}
	if links[0].SpanContext.TraceID() == acqB.SpanContext().TraceID() {
		t.Errorf("A's and B's requests share a trace: the link should cross traces")
	}
	if got := attrOf(links[0].Attributes, "locker.token"); got.AsInt64() != tokA {
		t.Errorf("the link's locker.token %v, want A's token %d", got.String(), tokA)
	}
	for _, s := range []sdktrace.ReadOnlySpan{acqA, try, relA, relB} {
		if n := len(s.Links()); n != 0 {
			t.Errorf("%s (token %d) has %d links, want none: it waited for nothing", s.Name(), token(s), n)
		}
	}
}

func parentName(byName map[string][]sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan) string {
	for name, spans := range byName {
		for _, p := range spans {
			if p.SpanContext().SpanID() == s.Parent().SpanID() {
				return name
			}
		}
	}
	return ""
}

func token(s sdktrace.ReadOnlySpan) int64 { return attrOf(s.Attributes(), "locker.token").AsInt64() }

func attrOf(kvs []attribute.KeyValue, k attribute.Key) attribute.Value {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}
