// Package backend holds what every locker backend needs and should not write
// again: the lifecycle of a Locker (Life: admission of calls, their contexts
// tied to Close, the goroutines and handles Close waits for and releases, a
// bounded two-phase Close), the end-of-life state of a Handle, which closes
// Done exactly once and remembers why (State), strict parsing of the query
// options of a backend's URL (Query), the settings every backend names the
// same way, their options, URL parameters and the one apply loop
// (Settings, Setting, Query.Shared, Apply), the error of a call on a key
// and the per-call options (KeyError, ApplyOptions), and a parse of the
// URL given to a backend's own Open that never echoes its password
// (ParseURL).
//
// It is for authors of backends, ours and third parties' alike; programs that
// only take locks never import it. memlock, the reference backend, is built on
// it and is the example to copy: its Locker keeps a *Life, admits every call
// with Life.Enter and closes with Life.Close; a Handle keeps a *State,
// answers Done and Err from it, and ends it (State.End) from whichever of
// Release, a failed renewal or Close comes first; an Opener registered with
// locker.Register reads its options with ParseQuery and rejects unknown ones
// with Query.Finish.
//
// Like the root package, backend depends on the standard library only.
package backend
