package sqltable

// Err returns the error of an invalid option or a nil *sql.DB given to New
// (wrapping locker.ErrInvalidOption), which every Acquire and TryAcquire
// also returns, or nil: a way to fail at start-up rather than at the first
// lock. It does not contact the database.
func (l *Locker) Err() error { return l.life.ConfigError() }
