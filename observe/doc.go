// Package observe records what a Locker does through OpenTelemetry: Wrap
// returns a Locker that takes its locks through the Locker it wraps, any
// backend's, ours or a third party's, and records metrics and spans on the
// way, through the OpenTelemetry metric and trace APIs. The program chooses
// the SDK and the exporters (Prometheus, OTLP, ...); without
// WithMeterProvider and WithTracerProvider the global providers are used,
// which record nothing until the program installs an SDK.
//
//	l := observe.Wrap(redis.New(client), observe.WithMeterProvider(mp))
//	h, err := l.Acquire(ctx, "payment/42") // recorded
//
// A program that does not import this package downloads nothing of
// OpenTelemetry (integration/deps checks a consumer's go.sum).
//
// # The wrapped Locker
//
// The wrapped Locker keeps the contract of the one it wraps: the same
// errors, tokens, TTLs, Done and Err, and exactly the optional interfaces
// (locker.Inspector, locker.Semaphorer, locker.ReadWriter) the wrapped one
// has, no more, so that a caller testing for one learns the truth. Handles
// are wrapped too (their Release is recorded); their Done and Err are the
// wrapped handle's own. Unwrap returns the wrapped Locker or Handle.
//
// A lock's end is recorded by its Release, in the caller's goroutine; a
// lock that ends otherwise (lost, or released by Close) is recorded by a
// watcher goroutine, which one sweeper per wrapped Locker starts for each
// lock held longer than 10ms, so a loss in the first 10ms of a hold is
// recorded up to 20ms late. Close returns once every end is recorded.
//
// # Metrics
//
// Every instrument is named locker.*, has a unit, and carries the attribute
// locker.backend (WithBackend, else the wrapped Locker's package name:
// "memlock", "redis", "redlock", ...; Open takes the URL's scheme) and
// locker.family ("mutex", "semaphore", "read", "write"):
//
//	locker.acquire.duration  histogram, s       every Acquire and TryAcquire (and the family calls), by
//	                                            locker.operation ("acquire", "try_acquire") and
//	                                            locker.outcome ("acquired", "not_acquired", "ctx_ended",
//	                                            "closed", "error")
//	locker.acquire.wait      histogram, s       an Acquire that waited for a key this wrapped Locker held
//	                                            (see below), by locker.outcome
//	locker.hold.duration     histogram, s       from acquisition to the end of the lock, by locker.end
//	                                            ("released": the holder's Release; "lost", "closed", "other")
//	locker.losses            counter, {lock}    locks that ended without their holder's Release, by
//	                                            locker.cause ("lost": the Handle's Err wraps ErrLost;
//	                                            "closed": the Locker's Close released it; "other")
//	locker.releases          counter, {release} every Release, by locker.outcome ("released", "lost",
//	                                            "already_released", "closed", "ctx_ended", "error")
//	locker.held              up-down counter, {lock} locks held now
//	locker.waiting           up-down counter, {call} callers in a blocking Acquire now
//
// No metric carries the key: keys are unbounded (and may name customers).
//
// The wait for a held key is seen where the wrapper can see it: an Acquire
// that began while a lock of the same key (and family) taken through this
// wrapped Locker was held, or, for a semaphore, while all of its permits
// were. A holder in another process is not seen: its waiters show in
// locker.acquire.duration with operation "acquire" only.
//
// # Spans
//
// Each Acquire, TryAcquire, AcquireSemaphore, TryAcquireSemaphore,
// AcquireRead, TryAcquireRead, AcquireWrite, TryAcquireWrite, Release and
// Inspect is a span ("locker.Acquire", ...; the multi-locks of
// locker.AcquireAll are one span per key, children of the caller's span)
// with the attributes locker.backend, locker.family, locker.outcome,
// locker.token (once acquired) and locker.semaphore.limit. The key is
// recorded only as the key policy says (WithKeys): not at all (KeyNone, the
// default), as locker.key.hash (KeyHash: the first 16 hex digits of its
// SHA-256, enough to correlate spans, not to hide a key that can be guessed),
// or as locker.key (KeyRaw). A span whose outcome is "error" has the status
// Error; its description is the error's text only under KeyRaw (errors name
// their key).
//
// A blocking Acquire that began while its key was held through the same
// wrapped Locker (the wait that locker.acquire.wait records) has a span
// link to the Acquire span of the lock it waited for (of a semaphore or a
// reader-writer lock: the latest acquisition of the key still held when
// the wait began), with that holder's locker.token as the link's
// attribute. In the trace of a contended handoff, holder A's request and
// waiter B's are two traces: B's locker.Acquire begins while A holds the
// key, and ends, with a higher token, once A's locker.Release has handed
// the lock over (A's Release span may end just before or just after it:
// the two run at once); its duration is B's wait, and its link leads to
// A's locker.Acquire. Only a holder seen by this wrapped Locker gives a
// link.
package observe
