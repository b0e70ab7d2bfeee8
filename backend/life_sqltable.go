package backend

// Closed reports whether Close has begun taking the held handles over. It
// turns true the moment Close takes them (a Hold after it fails), a little
// before Closing ends: a call that held h before it can tell, exactly,
// whether Close took h over (and releases it) or not.
func (l *Life[H]) Closed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
