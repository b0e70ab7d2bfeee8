package backend

import "time"

// Settle waits at most d until no call or goroutine that the Life counts is
// in progress, and reports whether none is. A backend's Closer.Shutdown can
// use it for one more bounded wait after Abandoned has ended: what
// Abandoned hurries (a wait whose socket is then closed) ends a moment
// later, and Settle lets Close return after it rather than before it,
// without the unbounded wait of Closer.Wait.
func (l *Life[H]) Settle(d time.Duration) bool { return l.wait(d) }
