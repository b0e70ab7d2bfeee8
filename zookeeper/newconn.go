package zookeeper

import (
	"context"
	"crypto/tls"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
)

// New returns a Locker on a connection you made with zk.Connect and keep:
// Close leaves it open. Its session is the Locker's primary session.
//
// What New reads from the connection itself: its session (SessionID,
// State) and the server it is on (Server). What it cannot read, it is
// told and checks:
//
//   - events must be the channel zk.Connect returned with conn: the Locker
//     becomes its only reader (go-zookeeper drops events nobody reads, so
//     a program that needs session events too registers
//     zk.WithEventCallback, which sees every event independently). A nil
//     channel fails every call with an error wrapping
//     locker.ErrInvalidOption; one that is not conn's (another
//     connection's, one of your own), or one another open Locker reads
//     (each would miss the events the other read), with one wrapping
//     locker.ErrUnsafeConfig and locker.ErrInvalidOption that says so.
//     One Locker serves any number of goroutines and keys.
//   - WithSessionTimeout, the timeout you gave zk.Connect, is required
//     (go-zookeeper does not tell what the server granted). The Locker
//     asks the server what it grants for that timeout (a short session of
//     its own to the server conn is on, or to WithServers), and fails
//     every call with an error wrapping locker.ErrUnsafeConfig when the
//     server grants another (it clamps to its minSessionTimeout and
//     maxSessionTimeout): then your session has that other timeout, and a
//     disconnected lock would be given up at the wrong moment. Calls wait
//     for the answer. A value that the server grants as is but that is not
//     the one you gave zk.Connect cannot be told from here: give the same.
//
// A lock's lease is the timeout of the session that owns its node. Your
// session serves every TTL from its timeout up to the next lease step
// (see leaseStep) as that timeout; with WithServers, New dials sessions of
// its own (as Connect does) for the other leases, so every TTL of the
// portable range works, and closes them when idle and on Close. Without
// it, a TTL above your session's timeout gets that timeout (a shorter
// lease, reported by Handle.TTL), and a shorter TTL is refused with an
// error wrapping locker.ErrInvalidOption that names WithServers: never a
// longer lease than asked.
func New(conn *zk.Conn, events <-chan zk.Event, opts ...Option) *Locker {
	cfg := newConfig(opts)
	switch {
	case cfg.err != nil:
	case conn == nil:
		cfg.err = fmt.Errorf("zookeeper: New: %w: nil connection", locker.ErrInvalidOption)
	case cfg.sessionTimeout == 0:
		cfg.err = fmt.Errorf("zookeeper: New: %w: WithSessionTimeout is required (the session timeout given to zk.Connect)", locker.ErrInvalidOption)
	case events == nil:
		// Without session events a disconnect goes unseen (no loss is
		// reported) and an expiry leaves the Locker on the old session.
		cfg.err = fmt.Errorf("zookeeper: New: %w: nil events channel (pass the channel zk.Connect returned; the Locker must see every session event)", locker.ErrInvalidOption)
	default:
		if same, known := connEvents(conn, events); known && !same {
			cfg.err = fmt.Errorf("zookeeper: New: %w: %w: the events channel is not the one zk.Connect returned with this connection (another connection's, or one of your own): the Locker would follow another session's events", locker.ErrUnsafeConfig, locker.ErrInvalidOption)
		}
	}
	l := newLocker(cfg)
	if cfg.err == nil {
		if _, taken := eventReaders.LoadOrStore(events, l); taken {
			// Each event goes to one reader: two Lockers on one channel
			// would each miss some of the disconnects and expiries, and
			// hold locks they had lost.
			cfg.err = fmt.Errorf("zookeeper: New: %w: %w: the events channel is already read by another Locker, not closed; one Locker serves any number of goroutines and keys: share it", locker.ErrUnsafeConfig, locker.ErrInvalidOption)
			l.cfg.err = cfg.err
		}
	}
	l.servers = cfg.servers
	s := newSession(l, cfg.sessionTimeout)
	s.conn = conn
	close(s.ready) // your connection carries your credentials
	l.primary = s
	l.life = backend.NewLife[*Handle](cfg.err)
	if cfg.err != nil {
		close(l.checked)
		return l
	}
	s.events = events
	if conn.State() == zk.StateHasSession {
		s.sessID, s.connected = conn.SessionID(), true
	}
	l.sessions[cfg.sessionTimeout] = s
	l.life.Go(func() { s.supervise(events) })
	l.life.Go(l.probe)
	return l
}

// eventReaders maps each events channel given to New to the Locker that
// reads it, until that Locker is closed.
var eventReaders sync.Map // <-chan zk.Event -> *Locker

// connEvents reports whether events is the channel zk.Connect returned
// with conn (go-zookeeper keeps it in the Conn, set once before Connect
// returns, so reading it races with nothing); known is false if the Conn
// does not show it (another go-zookeeper version): then the check is not
// made.
func connEvents(conn *zk.Conn, events <-chan zk.Event) (same, known bool) {
	f := reflect.ValueOf(conn).Elem().FieldByName("eventChan")
	if !f.IsValid() || f.Kind() != reflect.Chan || f.Type().Elem() != reflect.TypeFor[zk.Event]() {
		return false, false
	}
	return f.Pointer() == reflect.ValueOf(events).Pointer(), true
}

// probe checks the session timeout declared with WithSessionTimeout
// against what the server grants for it: it opens a session of its own,
// asking for that timeout, at the server your connection is on (or at
// WithServers), reads the timeout granted from the connect response, and
// closes the session. It tries again, every second, until a server
// answers or Close begins. Calls wait for its verdict (awaitChecked).
func (l *Locker) probe() {
	defer close(l.checked)
	s := l.primary
	ctx := l.life.Closing()
	for {
		servers := l.servers
		if servers == nil {
			if _, _, err := s.awaitConnected(ctx); err != nil {
				return // Close began: calls fail with ErrClosed
			}
			servers = []string{s.conn.Server()}
		}
		granted, err := grantFor(ctx, servers, s.asked, l.cfg.logger, l.cfg.tls)
		switch {
		case err == nil && granted != s.asked:
			l.checkErr = fmt.Errorf("zookeeper: New: %w: the server grants a session timeout of %v when asked for the %v declared with WithSessionTimeout (it clamps to its minSessionTimeout and maxSessionTimeout): your connection's session has %v too, and the Locker would give a disconnected lock up at the wrong moment; ask zk.Connect for %v and declare it",
				locker.ErrUnsafeConfig, granted, s.asked, granted, granted)
			return
		case err == nil:
			return
		case ctx.Err() != nil:
			return // Close began: calls fail with ErrClosed
		}
		l.logf("zookeeper: New: could not check the session timeout with %v (trying again): %v", servers, err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// grantFor opens a session at servers asking for timeout, and returns the
// timeout the server granted; the session is closed before it returns.
// It gives up after the handshake bound of one attempt (see link).
func grantFor(ctx context.Context, servers []string, timeout time.Duration, logger zk.Logger, tlsCfg *tls.Config) (time.Duration, error) {
	k := newLink(timeout, tlsCfg)
	established := make(chan struct{})
	var once sync.Once
	conn, _, err := zk.Connect(servers, timeout,
		zk.WithDialer(k.dial),
		zk.WithHostProvider(k.hosts),
		zk.WithLogger(logger),
		zk.WithEventCallback(func(ev zk.Event) {
			if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
				once.Do(func() { close(established) })
			}
		}))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	t := time.NewTimer(k.handshakeLimit() + time.Second)
	defer t.Stop()
	select {
	case <-established:
		return time.Duration(k.granted.Load()), nil
	case <-t.C:
		return 0, fmt.Errorf("no session within %v", k.handshakeLimit()+time.Second)
	case <-ctx.Done():
		return 0, backend.ContextError(ctx)
	}
}
