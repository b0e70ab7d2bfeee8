package zookeeper

// Err returns the error of an invalid option or argument given to New
// (wrapping locker.ErrInvalidOption), which every Acquire and TryAcquire
// also returns, or nil: a way to fail at start-up rather than at the first
// lock. (Connect returns such errors itself.) It does not contact the
// server.
func (l *Locker) Err() error { return l.cfg.err }
