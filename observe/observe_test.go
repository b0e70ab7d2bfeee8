package observe_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/memlock"
	"github.com/go-locker/locker/observe"
)

// TestConformance runs the shared suite on memlock wrapped: the wrapper
// keeps the contract (errors, tokens, Done and Err, the families,
// Inspect). memlock's Crash and Cut hooks are its own (unexported), so
// those cases skip here; the Redis run in the integration module has them.
func TestConformance(t *testing.T) {
	store := memlock.NewStore()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
	wrap := func(l locker.Locker) locker.Locker {
		return observe.Wrap(l, observe.WithMeterProvider(mp), observe.WithTracerProvider(tp), observe.WithKeys(observe.KeyHash))
	}
	conformance.Run(t, conformance.Harness{
		NewLocker: func(t *testing.T) locker.Locker { return wrap(store.NewLocker()) },
		Steal: func(t *testing.T, h locker.Handle) {
			if !store.RevokeToken(h.Key(), h.Token()) {
				t.Fatalf("Steal: %q (token %d) is not held in the store", h.Key(), h.Token())
			}
		},
		NewLockerWithTokenBase: func(t *testing.T, n int64) (locker.Locker, error) {
			l := store.NewLocker(memlock.WithTokenBase(n))
			if err := l.Err(); err != nil {
				return nil, err
			}
			return wrap(l), nil
		},
		InProcess:   true,
		URL:         "mem://observe-conformance",
		TTL:         locker.MinTTL,
		ExpiryBound: 2 * locker.MinTTL,
	})
}

// TestInterfaces: the wrapped Locker has exactly the optional interfaces
// of the Locker it wraps, for each combination, and memlock's.
func TestInterfaces(t *testing.T) {
	check := func(t *testing.T, l locker.Locker) {
		t.Helper()
		want := ifaces(l)
		if got := ifaces(observe.Wrap(l)); got != want {
			t.Errorf("Wrap(%T) has Inspector, Semaphorer, ReadWriter = %v, want %v (those of %T)", l, got, want, l)
		}
	}
	t.Run("memlock", func(t *testing.T) {
		l := memlock.NewStore().NewLocker()
		defer l.Close()
		if ifaces(l) != [3]bool{true, true, true} {
			t.Fatalf("memlock is no longer an Inspector, Semaphorer and ReadWriter: %v", ifaces(l))
		}
		check(t, l)
	})
	for _, l := range []locker.Locker{
		&bare{}, &struct {
			*bare
			inspectOnly
		}{}, &struct {
			*bare
			semOnly
		}{}, &struct {
			*bare
			rwOnly
		}{}, &struct {
			*bare
			inspectOnly
			semOnly
		}{}, &struct {
			*bare
			inspectOnly
			rwOnly
		}{}, &struct {
			*bare
			semOnly
			rwOnly
		}{}, &struct {
			*bare
			inspectOnly
			semOnly
			rwOnly
		}{},
	} {
		t.Run(fmt.Sprint(ifaces(l)), func(t *testing.T) { check(t, l) })
	}
}

func ifaces(l locker.Locker) [3]bool {
	_, in := l.(locker.Inspector)
	_, sem := l.(locker.Semaphorer)
	_, rw := l.(locker.ReadWriter)
	return [3]bool{in, sem, rw}
}

// bare is a Locker with no optional interface; inspectOnly, semOnly and
// rwOnly add one each. Their methods are never called.
type bare struct{}

func (*bare) Acquire(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (*bare) TryAcquire(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (*bare) Close() error { return nil }

type inspectOnly struct{}

func (inspectOnly) Inspect(context.Context, string) (locker.LockInfo, error) {
	return locker.LockInfo{}, errors.ErrUnsupported
}

type semOnly struct{}

func (semOnly) AcquireSemaphore(context.Context, string, int, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (semOnly) TryAcquireSemaphore(context.Context, string, int, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}

type rwOnly struct{}

func (rwOnly) AcquireRead(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (rwOnly) TryAcquireRead(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (rwOnly) AcquireWrite(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}
func (rwOnly) TryAcquireWrite(context.Context, string, ...locker.Option) (locker.Handle, error) {
	return nil, errors.ErrUnsupported
}

// TestHandlePassThrough: a wrapped Handle reports the wrapped one's key,
// token, TTL, Done and Err.
func TestHandlePassThrough(t *testing.T) {
	ctx := context.Background()
	l := observe.Wrap(memlock.NewStore().NewLocker())
	defer l.Close()
	h, err := l.Acquire(ctx, "pass", locker.WithTTL(7*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	inner := h.(interface{ Unwrap() locker.Handle }).Unwrap()
	if h.Key() != inner.Key() || h.Token() != inner.Token() || h.TTL() != inner.TTL() || h.Done() != inner.Done() || h.Err() != nil {
		t.Fatalf("wrapped handle (%q, %d, %v, %v) differs from the wrapped one (%q, %d, %v, %v)",
			h.Key(), h.Token(), h.TTL(), h.Err(), inner.Key(), inner.Token(), inner.TTL(), inner.Err())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(h.Err(), locker.ErrReleased) || h.Err() != inner.Err() {
		t.Fatalf("after Release: Err %v, the wrapped handle's %v", h.Err(), inner.Err())
	}
}

// points reads every data point of the reader: for a histogram its count
// (and its sum under "sum:" + the same name), for a counter its value,
// by "metric{attributes}" with the attributes locker.backend and
// locker.family left out.
func points(t *testing.T, r *sdkmetric.ManualReader) (map[string]float64, map[string]float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got, sums := map[string]float64{}, map[string]float64{}
	name := func(m metricdata.Metrics, s attribute.Set) string {
		var kv []string
		for _, a := range s.ToSlice() {
			if a.Key != "locker.backend" && a.Key != "locker.family" {
				kv = append(kv, string(a.Key)+"="+a.Value.String())
			} else if a.Key == "locker.backend" && a.Value.AsString() != "memlock" || a.Key == "locker.family" && a.Value.AsString() != "mutex" {
				t.Errorf("%s: attribute %s=%s, want memlock and mutex", m.Name, a.Key, a.Value.String())
			}
		}
		return m.Name + "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				if m.Unit != "s" {
					t.Errorf("%s: unit %q, want s", m.Name, m.Unit)
				}
				for _, p := range d.DataPoints {
					got[name(m, p.Attributes)] = float64(p.Count)
					sums[name(m, p.Attributes)] = p.Sum
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[name(m, p.Attributes)] = float64(p.Value)
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return got, sums
}

func checkPoints(t *testing.T, when string, got, want map[string]float64) {
	t.Helper()
	if !maps.Equal(got, want) {
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(maps.Collect(func(yield func(string, bool) bool) {
			for k := range got {
				yield(k, true)
			}
			for k := range want {
				yield(k, true)
			}
		}))) {
			if got[k] != want[k] {
				lines = append(lines, fmt.Sprintf("  %s: got %v, want %v", k, got[k], want[k]))
			}
		}
		t.Errorf("%s: metrics differ:\n%s", when, strings.Join(lines, "\n"))
	}
}

// TestMetrics reads the metrics through the SDK's in-memory reader after a
// scripted sequence on memlock: A acquires k1; W's Acquire of k1 waits
// behind it; k1 is stolen from A (the store revokes it: a loss), which
// hands it to W (the second acquisition); W releases it.
func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store := memlock.NewStore()
	l := observe.Wrap(store.NewLocker(), observe.WithMeterProvider(mp))

	a, err := l.Acquire(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := points(t, reader)
	checkPoints(t, "after A's acquisition", got, map[string]float64{
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}": 1,
		"locker.held{}":    1,
		"locker.waiting{}": 0,
	})

	type result struct {
		h   locker.Handle
		err error
	}
	wres := make(chan result, 1)
	go func() {
		h, err := l.Acquire(ctx, "k1")
		wres <- result{h, err}
	}()
	// The waiting gauge is the signal that W is in its Acquire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ = points(t, reader)
		if got["locker.waiting{}"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("W's Acquire never counted as waiting: %v", got)
		}
		time.Sleep(time.Millisecond)
	}
	checkPoints(t, "while W waits", got, map[string]float64{
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}": 1,
		"locker.held{}":    1,
		"locker.waiting{}": 1,
	})

	if !store.RevokeToken("k1", a.Token()) {
		t.Fatal("RevokeToken: k1 is not held by A")
	}
	<-a.Done()
	r := <-wres
	if r.err != nil {
		t.Fatalf("W: %v", r.err)
	}
	if r.h.Token() <= a.Token() {
		t.Fatalf("W's token %d is not above A's %d", r.h.Token(), a.Token())
	}
	if err := r.h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Close returns once the end of every lock is recorded (A's loss is
	// recorded by a watcher as soon as A's Done closes).
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, sums := points(t, reader)
	checkPoints(t, "at the end", got, map[string]float64{
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}": 2,
		"locker.acquire.wait{locker.outcome=acquired}":                              1,
		"locker.hold.duration{locker.end=lost}":                                     1,
		"locker.hold.duration{locker.end=released}":                                 1,
		"locker.losses{locker.cause=lost}":                                          1,
		"locker.releases{locker.outcome=released}":                                  1,
		"locker.held{}":    0,
		"locker.waiting{}": 0,
	})
	// W waited for as long as A held k1 after W began: its wait is at
	// most A's hold, and W's Acquire is within the acquisitions' total.
	wait, holdA := sums["locker.acquire.wait{locker.outcome=acquired}"], sums["locker.hold.duration{locker.end=lost}"]
	if wait <= 0 || wait > holdA || wait > sums["locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}"] {
		t.Errorf("wait %vs, A's hold %vs, acquisitions %vs: want 0 < wait ≤ both", wait, holdA, sums["locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}"])
	}
}

// TestOutcomes: TryAcquire on a held key, a cancelled wait, a second
// Release, Close with a lock held and an Acquire after Close are each
// recorded under their outcome.
func TestOutcomes(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	l := observe.Wrap(memlock.NewStore().NewLocker(), observe.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	h, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Acquire(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled ctx: %v", err)
	}
	if _, err := l.Acquire(ctx, ""); !errors.Is(err, locker.ErrInvalidKey) {
		t.Fatalf("Acquire of an empty key: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); !errors.Is(err, locker.ErrReleased) {
		t.Fatalf("second Release: %v", err)
	}
	if _, err := l.Acquire(ctx, "held-at-close"); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k"); !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	got, _ := points(t, reader)
	checkPoints(t, "outcomes", got, map[string]float64{
		"locker.acquire.duration{locker.operation=try_acquire,locker.outcome=acquired}":     1,
		"locker.acquire.duration{locker.operation=try_acquire,locker.outcome=not_acquired}": 1,
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=ctx_ended}":        1,
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=error}":            1,
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=acquired}":         1,
		"locker.acquire.duration{locker.operation=acquire,locker.outcome=closed}":           1,
		// The cancelled Acquire began while k was held through l.
		"locker.acquire.wait{locker.outcome=ctx_ended}":    1,
		"locker.releases{locker.outcome=released}":         1,
		"locker.releases{locker.outcome=already_released}": 1,
		"locker.hold.duration{locker.end=released}":        1,
		"locker.hold.duration{locker.end=closed}":          1,
		"locker.losses{locker.cause=closed}":               1,
		"locker.held{}":                                    0,
		"locker.waiting{}":                                 0,
	})
}

// spanAttrs is a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

// TestSpans checks the spans through the SDK's in-memory exporter: one per
// call, children of the caller's span, with the backend, family, outcome
// and token, and the key as the policy says.
func TestSpans(t *testing.T) {
	const key = "customer/1234"
	sum := sha256.Sum256([]byte(key))
	for _, tc := range []struct {
		policy      observe.KeyPolicy
		attr        attribute.Key // the key's attribute, if any
		value       string
		errorStatus string
	}{
		{observe.KeyNone, "", "", "error"},
		{observe.KeyHash, "locker.key.hash", hex.EncodeToString(sum[:8]), "error"},
		{observe.KeyRaw, "locker.key", key, `try-acquire-semaphore "customer/1234"`},
	} {
		t.Run([]string{"KeyNone", "KeyHash", "KeyRaw"}[tc.policy], func(t *testing.T) {
			ctx := context.Background()
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			ctx, parent := tp.Tracer("test").Start(ctx, "caller")
			l := observe.Wrap(memlock.NewStore().NewLocker(), observe.WithTracerProvider(tp), observe.WithKeys(tc.policy))
			defer l.Close()
			h, err := l.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.TryAcquire(ctx, key); !errors.Is(err, locker.ErrNotAcquired) {
				t.Fatalf("TryAcquire of a held key: %v", err)
			}
			p, err := l.(locker.Semaphorer).AcquireSemaphore(ctx, key, 3)
			if err != nil {
				t.Fatal(err)
			}
			// An error: the semaphore's limit differs from its holder's.
			if _, err := l.(locker.Semaphorer).TryAcquireSemaphore(ctx, key, 2); !errors.Is(err, locker.ErrLimitMismatch) {
				t.Fatalf("TryAcquireSemaphore with another limit: %v", err)
			}
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			parent.End()

			type want struct {
				name, family, outcome string
				token                 int64 // 0: no locker.token
				limit                 int64 // 0: no locker.semaphore.limit
				status                codes.Code
			}
			wants := []want{
				{"locker.Acquire", "mutex", "acquired", h.Token(), 0, codes.Unset},
				{"locker.TryAcquire", "mutex", "not_acquired", 0, 0, codes.Unset},
				{"locker.AcquireSemaphore", "semaphore", "acquired", p.Token(), 3, codes.Unset},
				{"locker.TryAcquireSemaphore", "semaphore", "error", 0, 2, codes.Error},
				{"locker.Release", "mutex", "released", h.Token(), 0, codes.Unset},
				{"locker.Release", "semaphore", "released", p.Token(), 0, codes.Unset},
			}
			spans := exp.GetSpans().Snapshots()
			if len(spans) != len(wants)+1 {
				t.Fatalf("%d spans, want %d and the caller's", len(spans), len(wants))
			}
			for i, w := range wants {
				s := spans[i]
				a := spanAttrs(s)
				if s.Name() != w.name {
					t.Errorf("span %d: %s, want %s", i, s.Name(), w.name)
				}
				if s.Parent().SpanID() != parent.SpanContext().SpanID() {
					t.Errorf("%s: not a child of the caller's span", s.Name())
				}
				if a["locker.backend"].AsString() != "memlock" || a["locker.family"].AsString() != w.family || a["locker.outcome"].AsString() != w.outcome {
					t.Errorf("%s: backend %q, family %q, outcome %q; want memlock, %s, %s", s.Name(),
						a["locker.backend"].AsString(), a["locker.family"].AsString(), a["locker.outcome"].AsString(), w.family, w.outcome)
				}
				if tok, ok := a["locker.token"]; ok != (w.token != 0) || tok.AsInt64() != w.token {
					t.Errorf("%s: locker.token %v (set: %v), want %d", s.Name(), tok.AsInt64(), ok, w.token)
				}
				if lim, ok := a["locker.semaphore.limit"]; ok != (w.limit != 0) || lim.AsInt64() != w.limit {
					t.Errorf("%s: locker.semaphore.limit %v (set: %v), want %d", s.Name(), lim.AsInt64(), ok, w.limit)
				}
				if s.Status().Code != w.status {
					t.Errorf("%s: status %v, want %v", s.Name(), s.Status().Code, w.status)
				}
				if w.status == codes.Error && !strings.HasPrefix(s.Status().Description, tc.errorStatus) {
					t.Errorf("%s: status description %q, want it to begin %q", s.Name(), s.Status().Description, tc.errorStatus)
				}
				for _, k := range []attribute.Key{"locker.key", "locker.key.hash"} {
					v, ok := a[k]
					if k == tc.attr {
						if !ok || v.AsString() != tc.value {
							t.Errorf("%s: %s = %q, want %q", s.Name(), k, v.AsString(), tc.value)
						}
					} else if ok {
						t.Errorf("%s: has %s = %q under policy %v", s.Name(), k, v.AsString(), tc.policy)
					}
				}
			}
		})
	}
}

// TestBackendName: the backend is named after the wrapped Locker's package,
// the URL's scheme with Open, or WithBackend.
func TestBackendName(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		open func(opts ...observe.Option) (locker.Locker, error)
	}{
		{"memlock", func(opts ...observe.Option) (locker.Locker, error) {
			return observe.Wrap(memlock.NewStore().NewLocker(), opts...), nil
		}},
		{"mem", func(opts ...observe.Option) (locker.Locker, error) {
			return observe.Open(ctx, "mem://observe-name", opts...)
		}},
		{"mine", func(opts ...observe.Option) (locker.Locker, error) {
			return observe.Open(ctx, "mem://observe-name", append(opts, observe.WithBackend("mine"))...)
		}},
	} {
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		l, err := tc.open(observe.WithTracerProvider(tp))
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.Acquire(ctx, "name")
		if err != nil {
			t.Fatal(err)
		}
		_ = h.Release(ctx)
		_ = l.Close()
		spans := exp.GetSpans()
		if len(spans) != 2 {
			t.Fatalf("%d spans, want 2", len(spans))
		}
		if got := spanAttrs(spans[0].Snapshot())["locker.backend"].AsString(); got != tc.name {
			t.Errorf("locker.backend = %q, want %q", got, tc.name)
		}
	}
}

// TestAtRiskPassThrough: a wrapped Handle is a locker.AtRisker exactly
// when the wrapped one is, and reports what it reports.
func TestAtRiskPassThrough(t *testing.T) {
	ctx := context.Background()
	inner := memlock.NewStore().NewLocker()
	for _, tc := range []struct {
		name string
		l    locker.Locker
		want bool
	}{
		{"memlock", observe.Wrap(inner), true},
		{"without", observe.Wrap(hideRisk{inner}), false},
	} {
		h, err := tc.l.Acquire(ctx, "risk-"+tc.name)
		if err != nil {
			t.Fatal(err)
		}
		r, ok := h.(locker.AtRisker)
		if ok != tc.want {
			t.Errorf("%s: wrapped handle is an AtRisker: %t, want %t", tc.name, ok, tc.want)
		}
		if ok {
			in := h.(interface{ Unwrap() locker.Handle }).Unwrap().(locker.AtRisker)
			at, ch := r.AtRisk()
			inAt, inCh := in.AtRisk()
			if at || at != inAt || ch != inCh {
				t.Errorf("%s: AtRisk %t, %v; the wrapped handle's %t, %v", tc.name, at, ch, inAt, inCh)
			}
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = inner.Close()
}

// hideRisk is a Locker whose Handles have only locker.Handle's methods.
type hideRisk struct{ l locker.Locker }

func (x hideRisk) Acquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := x.l.Acquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return struct{ locker.Handle }{h}, nil
}

func (x hideRisk) TryAcquire(ctx context.Context, key string, opts ...locker.Option) (locker.Handle, error) {
	h, err := x.l.TryAcquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return struct{ locker.Handle }{h}, nil
}

func (x hideRisk) Close() error { return nil }
