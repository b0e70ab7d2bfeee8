package observe

import (
	"context"
	"fmt"
	"net/url"
	"path"
	"reflect"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-locker/locker"
)

// scope is the instrumentation scope of the meter and the tracer.
const scope = "github.com/go-locker/locker/observe"

// KeyPolicy says whether and how spans carry the key (see WithKeys).
type KeyPolicy int

const (
	// KeyNone records no key: the default, since keys may carry customer
	// ids.
	KeyNone KeyPolicy = iota
	// KeyHash records locker.key.hash: the first 16 hex digits of the
	// key's SHA-256. It correlates the spans of one key; it does not hide
	// a key that can be guessed (an order number), since anyone can hash
	// the guesses.
	KeyHash
	// KeyRaw records the key itself as locker.key, and error texts (which
	// name their key) as the status of failed spans.
	KeyRaw
)

// Option configures Wrap.
type Option func(*config)

type config struct {
	mp      metric.MeterProvider
	tp      trace.TracerProvider
	backend string
	keys    KeyPolicy
}

// WithMeterProvider records the metrics through mp; without it, through
// otel.GetMeterProvider() at the time of Wrap.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider records the spans through tp; without it, through
// otel.GetTracerProvider() at the time of Wrap.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithBackend names the backend in the attribute locker.backend; without
// it Wrap names it after the wrapped Locker's package ("memlock", "redis",
// "redlock", "postgres", "etcd", "zookeeper", "sqltable"), and Open after
// the URL's scheme.
func WithBackend(name string) Option {
	return func(c *config) { c.backend = name }
}

// WithKeys sets the key policy of spans: KeyNone (the default), KeyHash or
// KeyRaw. Metrics never carry the key.
func WithKeys(p KeyPolicy) Option {
	return func(c *config) { c.keys = p }
}

// Open opens url with locker.Open and wraps the Locker, named after the
// URL's scheme unless WithBackend is given.
func Open(ctx context.Context, rawURL string, opts ...Option) (locker.Locker, error) {
	l, err := locker.Open(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if u, err := url.Parse(rawURL); err == nil && u.Scheme != "" {
		opts = append([]Option{WithBackend(u.Scheme)}, opts...)
	}
	return Wrap(l, opts...), nil
}

// backendName names l after its package: the last element of the import
// path of its type (a pointer's element type).
func backendName(l locker.Locker) string {
	t := reflect.TypeOf(l)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if p := t.PkgPath(); p != "" {
		return path.Base(p)
	}
	if s := strings.TrimLeft(fmt.Sprintf("%T", l), "*"); s != "" {
		return s
	}
	return "unknown"
}

// The attribute keys.
const (
	attrBackend   = attribute.Key("locker.backend")
	attrFamily    = attribute.Key("locker.family")
	attrOperation = attribute.Key("locker.operation")
	attrOutcome   = attribute.Key("locker.outcome")
	attrEnd       = attribute.Key("locker.end")
	attrCause     = attribute.Key("locker.cause")
	attrToken     = attribute.Key("locker.token")
	attrLimit     = attribute.Key("locker.semaphore.limit")
	attrKey       = attribute.Key("locker.key")
	attrKeyHash   = attribute.Key("locker.key.hash")
)

// family is a lock family: the mutex, a semaphore, a read or a write lock.
type family int

const (
	famMutex family = iota
	famSemaphore
	famRead
	famWrite
	nFamilies
)

var familyNames = [nFamilies]string{"mutex", "semaphore", "read", "write"}

// acquireOutcome is how an acquisition ended.
type acquireOutcome int

const (
	acqAcquired acquireOutcome = iota
	acqNotAcquired
	acqCtxEnded
	acqClosed
	acqError
	nAcquireOutcomes
)

var acquireOutcomeNames = [nAcquireOutcomes]string{"acquired", "not_acquired", "ctx_ended", "closed", "error"}

// releaseOutcome is how a Release ended.
type releaseOutcome int

const (
	relReleased releaseOutcome = iota
	relLost
	relAlreadyReleased
	relClosed
	relCtxEnded
	relError
	nReleaseOutcomes
)

var releaseOutcomeNames = [nReleaseOutcomes]string{"released", "lost", "already_released", "closed", "ctx_ended", "error"}

// end is how a lock ended: its holder's Release, or a loss by cause.
type end int

const (
	endReleased end = iota
	endLost
	endClosed
	endOther
	nEnds
)

var endNames = [nEnds]string{"released", "lost", "closed", "other"}

// The operations: a blocking acquisition or one attempt.
const (
	opAcquire = iota
	opTry
	nOps
)

var opNames = [nOps]string{"acquire", "try_acquire"}

// latencyBuckets are the bucket bounds of the three histograms, in seconds:
// from a local round trip to an hour's hold.
var latencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
}

// recorder holds the instruments and, precomputed so that recording
// allocates nothing, the measurement options of every attribute set.
type recorder struct {
	tracer trace.Tracer
	keys   KeyPolicy

	acquireDur metric.Float64Histogram
	waitDur    metric.Float64Histogram
	holdDur    metric.Float64Histogram
	losses     metric.Int64Counter
	releases   metric.Int64Counter
	held       metric.Int64UpDownCounter
	waiting    metric.Int64UpDownCounter
	atRisk     metric.Int64UpDownCounter

	base      [nFamilies][]attribute.KeyValue // backend and family: the spans' first attributes
	acquire   [nFamilies][nOps][nAcquireOutcomes][]metric.RecordOption
	wait      [nFamilies][nAcquireOutcomes][]metric.RecordOption
	hold      [nFamilies][nEnds][]metric.RecordOption
	loss      [nFamilies][nEnds][]metric.AddOption
	release   [nFamilies][nReleaseOutcomes][]metric.AddOption
	family    [nFamilies][]metric.AddOption
	spanName  [nFamilies][nOps]string
	spanStart [nFamilies][]trace.SpanStartOption
}

func newRecorder(c config) *recorder {
	meter := c.mp.Meter(scope)
	r := &recorder{tracer: c.tp.Tracer(scope), keys: c.keys}
	// The API never fails to make an instrument (an SDK that refuses one
	// reports it through otel.Handle and returns a no-op instrument).
	r.acquireDur, _ = meter.Float64Histogram("locker.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("How long Acquire and TryAcquire took, by outcome."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	r.waitDur, _ = meter.Float64Histogram("locker.acquire.wait", metric.WithUnit("s"),
		metric.WithDescription("How long an Acquire waited for a key held through the same Locker."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	r.holdDur, _ = meter.Float64Histogram("locker.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a lock was held, from acquisition to its end."),
		metric.WithExplicitBucketBoundaries(latencyBuckets...))
	r.losses, _ = meter.Int64Counter("locker.losses", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks that ended without their holder's Release, by cause."))
	r.releases, _ = meter.Int64Counter("locker.releases", metric.WithUnit("{release}"),
		metric.WithDescription("Releases, by outcome."))
	r.held, _ = meter.Int64UpDownCounter("locker.held", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now."))
	r.waiting, _ = meter.Int64UpDownCounter("locker.waiting", metric.WithUnit("{call}"),
		metric.WithDescription("Callers in a blocking Acquire now."))
	r.atRisk, _ = meter.Int64UpDownCounter("locker.at_risk", metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now that their backend reports at risk (locker.AtRisker): a renewal failing, a connection down."))

	backend := attrBackend.String(c.backend)
	spanNames := [nFamilies][nOps]string{
		{"locker.Acquire", "locker.TryAcquire"},
		{"locker.AcquireSemaphore", "locker.TryAcquireSemaphore"},
		{"locker.AcquireRead", "locker.TryAcquireRead"},
		{"locker.AcquireWrite", "locker.TryAcquireWrite"},
	}
	for f := range nFamilies {
		fam := attrFamily.String(familyNames[f])
		r.base[f] = []attribute.KeyValue{backend, fam}
		r.family[f] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(backend, fam))}
		r.spanName[f] = spanNames[f]
		r.spanStart[f] = []trace.SpanStartOption{trace.WithAttributes(r.base[f]...), trace.WithSpanKind(trace.SpanKindInternal)}
		for o := range nAcquireOutcomes {
			out := attrOutcome.String(acquireOutcomeNames[o])
			for op := range nOps {
				r.acquire[f][op][o] = []metric.RecordOption{metric.WithAttributeSet(
					attribute.NewSet(backend, fam, attrOperation.String(opNames[op]), out))}
			}
			r.wait[f][o] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(backend, fam, out))}
		}
		for e := range nEnds {
			r.hold[f][e] = []metric.RecordOption{metric.WithAttributeSet(
				attribute.NewSet(backend, fam, attrEnd.String(endNames[e])))}
			r.loss[f][e] = []metric.AddOption{metric.WithAttributeSet(
				attribute.NewSet(backend, fam, attrCause.String(endNames[e])))}
		}
		for o := range nReleaseOutcomes {
			r.release[f][o] = []metric.AddOption{metric.WithAttributeSet(
				attribute.NewSet(backend, fam, attrOutcome.String(releaseOutcomeNames[o])))}
		}
	}
	return r
}

// keyAttr is the key's span attribute under the key policy, if any.
func (r *recorder) keyAttr(key string) (attribute.KeyValue, bool) {
	switch r.keys {
	case KeyHash:
		return attrKeyHash.String(hashKey(key)), true
	case KeyRaw:
		return attrKey.String(key), true
	}
	return attribute.KeyValue{}, false
}

// errText is what a failed span says of err: its text under KeyRaw, else
// only that it failed (an error names its key).
func (r *recorder) errText(err error) string {
	if r.keys == KeyRaw {
		return err.Error()
	}
	return "error"
}

func newConfig(l locker.Locker, opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.backend == "" {
		c.backend = backendName(l)
	}
	return c
}
