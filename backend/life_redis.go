package backend

// Call runs f on the caller's goroutine as a call that Close waits for (as
// Begin and End count one), and reports true; once Close has begun it runs
// nothing and reports false. It is the Go hook of a lease keeper
// (internal/lease), whose renewals and loss reports must not start once
// Close is releasing the handles itself.
func (l *Life[H]) Call(f func()) bool {
	if !l.Begin() {
		return false
	}
	defer l.End()
	f()
	return true
}
