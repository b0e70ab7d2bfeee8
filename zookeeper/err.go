package zookeeper

// Err returns the error of an invalid option or argument given to New
// (wrapping locker.ErrInvalidOption, or locker.ErrUnsafeConfig for an
// events channel that is another connection's or another Locker's), which
// every Acquire and TryAcquire also returns, or nil: a way to fail at
// start-up rather than at the first lock. (Connect returns such errors
// itself.) It does not contact the server; once New's check of the
// session timeout with the server is done (see New), it also returns that
// check's error.
func (l *Locker) Err() error {
	if l.cfg.err != nil {
		return l.cfg.err
	}
	select {
	case <-l.checked:
		return l.checkErr
	default:
		return nil
	}
}
