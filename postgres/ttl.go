package postgres

import (
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/lease"
)

// The TTL of an advisory lock (see locker.MinTTL) is a bound the server
// keeps on the session that holds it. A session lock lasts as long as its
// session, so the lease is how long the server keeps a session it hears
// nothing from:
//
//   - idle_session_timeout (PostgreSQL 14+, in milliseconds) ends a session
//     idle that long, however the client went silent: its machine or
//     network gone, its process hung, or its close lost on the way. The
//     session that holds a lock gets the lease as its idle_session_timeout,
//     and each health check starts it again. This is the lease.
//   - On older servers, which lack it, TCP keepalive (tcp_keepalives_idle,
//     _interval and _count, in seconds) and tcp_user_timeout (12+) make the
//     server's kernel drop the connection of a client whose machine or
//     network is gone. They are set from the TTL, to drop a dead peer
//     within it (rounded down to whole seconds, at least 2s), and the lease
//     is what they give. They cannot tell a hung client process, whose
//     kernel still answers, from a live one, nor do anything on a
//     Unix-domain socket.
//
// PostgreSQL 14+ gets idle_session_timeout alone: it bounds every way a
// holder can go silent, TCP keepalive adds no case to it for an idle
// session (a holding session is idle but for its health checks), and
// setting and restoring the four TCP settings costs about half again the
// time of an uncontended acquisition and release (one setsockopt each way,
// measured 40–60 µs on the test machine).
//
// The settings are ones any role may change for its own session, set on
// the session that holds the lock in the statement that grants it (only
// when it grants it), and set back to what they were in the statement that
// unlocks it, before the connection returns to the pool. A connection whose
// lock was lost, or whose unlock failed, is closed, never pooled with them.
//
// The holder keeps its side of the bound by its health checks (see
// monitor): every third of the lease at least, and it reports the loss
// once no check has been answered for the lease less a drift margin,
// counted from the moment the last answered statement was sent. The server
// started its idle timer later than that, when it had answered, so the
// holder hears of the loss before the server can free the lock.

// limits are the package's checks of lease settings.
var limits = lease.Limits{Backend: "postgres"}

// The settings of a holding session, as the server names them.
const (
	gucIdle      = "idle_session_timeout"
	gucUser      = "tcp_user_timeout"
	gucKAIdle    = "tcp_keepalives_idle"
	gucKAIntvl   = "tcp_keepalives_interval"
	gucKACount   = "tcp_keepalives_count"
	minKeepalive = 2 * time.Second // one second of idleness, one probe a second later
)

// Linux's limits on the keepalive socket options (MAX_TCP_KEEPIDLE,
// MAX_TCP_KEEPINTVL, MAX_TCP_KEEPCNT).
const (
	maxKeepaliveSecs  = 32767
	maxKeepaliveCount = 127
)

// namesIdle and namesIdleApp are the settings of a lock on PostgreSQL 14+,
// without and with the holder's application_name (see withOwner); shared,
// never written (each is full to its capacity, so an append copies).
var (
	namesIdle    = []string{gucIdle}
	namesIdleApp = []string{gucIdle, gucApp}
)

// terms is the lease of one lock and how it is kept.
type terms struct {
	lease  time.Duration // Handle.TTL: how long the server keeps a silent holder's lock
	drift  time.Duration // how long before the lease may have run out the holder gives up
	period time.Duration // between health checks, and the length of a wait's slice
	names  []string      // the session settings that keep the lease
	values []string      // their values while the lock is held
}

// ttlOf returns the TTL asked for by the options of one call (locker.WithTTL
// checked its range), else the Locker's default.
func (l *Locker) ttlOf(o locker.Options) time.Duration {
	if o.TTL > 0 {
		return o.TTL
	}
	return l.cfg.defaultTTL()
}

// termsFor returns the terms of a lock with TTL ttl on a server of major
// version major (0: unknown, taken as recent).
func (l *Locker) termsFor(ttl time.Duration, major int) (terms, error) {
	var t terms
	if major == 0 || major >= 14 {
		t.lease = ttl.Truncate(time.Millisecond)
		t.names = namesIdle
		idle := l.defaultIdle
		if t.lease != l.cfg.defaultTTL().Truncate(time.Millisecond) || idle == "" {
			idle = millis(t.lease)
		}
		t.values = []string{idle}
	} else {
		ka := keepaliveFor(ttl)
		t.lease = ka.total
		t.names = []string{gucKAIdle, gucKAIntvl, gucKACount}
		t.values = []string{secs(ka.idle), secs(ka.interval), strconv.Itoa(ka.count)}
		if major >= 12 {
			t.names = append(t.names, gucUser)
			t.values = append(t.values, millis(ka.total))
		}
	}
	drift, err := limits.Drift("drift margin", l.cfg.DriftMargin, t.lease)
	if err != nil {
		return terms{}, err
	}
	t.drift = drift
	t.period = min(l.cfg.interval, t.lease/3)
	return t, nil
}

// keepalive is the server's TCP keepalive for a lease.
type keepalive struct {
	idle, interval time.Duration // whole seconds
	count          int
	total          time.Duration // idle + interval×count
}

// keepaliveFor returns keepalive settings that drop a silent peer's
// connection within d: idle and interval a quarter of d each (whole
// seconds, at least one), and as many probes as fit in d. A peer whose
// machine or network is gone answers no probe, and the server's kernel
// drops the connection after idle + interval×count: the lease rounded down
// to the grid of whole intervals, at least 2s (the kernel counts in
// seconds, and cannot do with fewer than one idle second and one probe).
// tcp_user_timeout (PostgreSQL 12+) is set to the same total: with it,
// Linux drops the connection at the first probe due that long after the
// peer was last heard from, and also when data it sent stays
// unacknowledged that long.
func keepaliveFor(d time.Duration) keepalive {
	whole := int(d / time.Second)
	step := min(max(1, whole/4), maxKeepaliveSecs)
	count := min(max(1, (whole-step)/step), maxKeepaliveCount)
	return keepalive{
		idle:     time.Duration(step) * time.Second,
		interval: time.Duration(step) * time.Second,
		count:    count,
		total:    time.Duration(step*(1+count)) * time.Second,
	}
}

// serverMajor returns the major version of the server pc is connected to,
// from the server_version it reported at connect time, or 0 when it cannot
// tell.
func serverMajor(pc *pgconn.PgConn) int {
	v := pc.ParameterStatus("server_version")
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
func secs(d time.Duration) string   { return strconv.FormatInt(int64(d/time.Second), 10) + "s" }

// TTL returns the lease of the lock: how long the server keeps it after
// this holder went silent. It is the TTL asked (locker.WithTTL, else the
// Locker's default, WithDefaultTTL), rounded down to a whole millisecond
// (idle_session_timeout's unit); on a server older than PostgreSQL 14,
// what TCP keepalive gives for it: the TTL rounded down to whole seconds,
// at least 2s (see the package documentation).
func (h *handle) TTL() time.Duration { return h.terms.lease }

// expired is the cause of a loss by the holder's own clock: no statement
// answered within the lease less the drift margin.
func (h *handle) expired(since time.Time) error {
	return fmt.Errorf("no answer from the server for %v (the lease is %v, given up %v early): the server may have ended the silent session, and freed the lock",
		time.Since(since).Round(time.Millisecond), h.terms.lease, h.terms.drift)
}
