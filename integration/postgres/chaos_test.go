package postgres_test

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/chaos"
	"github.com/go-locker/locker/integration/testserver"
)

// chaosURLEnv hands each chaos worker process the URL it opens its Locker
// with: the private server, through that worker's own fault proxy.
const chaosURLEnv = "LOCKER_TEST_POSTGRES_CHAOS_URL"

// chaosInterval is the health-check interval of the chaos workers. The
// backend has no lease (the TTL the workers ask for is ignored): what
// bounds how long a cut-off holder keeps believing it holds its lock is two
// health-check intervals. Half the run's TTL makes that bound the TTL, as
// for the lease-based backends, and leaves a check a whole second to answer
// on a loaded machine.
const chaosInterval = time.Second

// chaosBed is the run's test bed: a private server the nemesis pauses and
// kills, and one fault proxy per worker. It is made in the test process, at
// the first WorkerEnv call: the worker processes run the test function too,
// and must not start servers of their own.
type chaosBed struct {
	mu    sync.Mutex
	srv   *testserver.Server
	links testserver.ChaosLinks
}

func (b *chaosBed) server(t *testing.T) *testserver.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv == nil {
		srv := testserver.NewPostgres(t)
		if !srv.CanControl() {
			t.Skipf("the chaos run pauses, kills and restarts its server; %s cannot be", srv)
		}
		makeDurable(t, srv)
		b.srv = srv
	}
	return b.srv
}

func (b *chaosBed) current() *testserver.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}

// makeDurable turns synchronous_commit back on for the locker database: the
// test servers run with it off, for speed, and then a killed server may
// forget the last values nextval handed out, which the package
// documentation says tokens need ("nextval survives a server crash when
// synchronous_commit is on (the default)"). fsync=off does not matter here:
// a killed container's writes are in the host's page cache, which survives.
func makeDurable(t *testing.T, srv *testserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatalf("connect to %s: %v", srv, err)
	}
	defer conn.Close(context.Background())
	// The ALTER's own commit is synchronous too, so that it survives the
	// first kill.
	for _, q := range []string{"SET synchronous_commit = on", "ALTER DATABASE locker SET synchronous_commit = on"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	check, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatalf("connect to %s: %v", srv, err)
	}
	defer check.Close(context.Background())
	var v string
	if err := check.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil || v != "on" {
		t.Fatalf("a new session's synchronous_commit = %q, %v; want on", v, err)
	}
}

// TestChaos runs the advisory-lock backend under the chaos suite: worker
// processes lock, write to a fenced register and release while the
// nemesis stops holder processes (SIGSTOP) past the TTL, pauses the server
// (docker pause), kills it and starts it again, and partitions, slows or
// blackholes (then resets) one worker's link.
//
// What each fault means for session locks:
//   - holder-pause: the frozen process's session stays open (its kernel
//     still answers TCP), so it keeps its lock; others wait, and nobody is
//     told anything. A lock kept by a frozen holder is correct here: there
//     is no lease to run out.
//   - server-pause: holders hear nothing from their checks and give their
//     locks up within two intervals, closing their connections; the server,
//     once thawed, sees the closes and frees the locks.
//   - server-restart: every session ends; holders hear of it when the
//     server's socket closes. Tokens must keep rising across the restart,
//     which rests on synchronous_commit (see makeDurable).
//   - link-partition: the holder's session stays on the server, which sees
//     nothing wrong, until the holder, whose checks go unanswered, gives up
//     within two intervals and closes its connection. The proxy passes that
//     close to the server at once (testserver.Proxy.Partition), standing in
//     for what the package documentation asks of the server: keepalive and
//     tcp_user_timeout above two intervals, so that the server ends the
//     session only after the holder gave up. Over a real partition the
//     lock would stay on the server longer, until those timeouts fire
//     (others wait longer), but in the same order: the holder is told
//     first. The nemesis's partitions last 1 to 3 TTLs (2 to 6 intervals),
//     so nearly every one ends the lock of a holder it cuts.
//   - link-latency: 300ms more on every round trip of one worker, less than
//     a check's deadline: no lock may be lost to it.
//   - link-blackhole: a cut as above, but its end resets every connection
//     of the worker (a NAT or firewall that dropped the flows): the server
//     ends the sessions and frees their locks at that moment, and a holder
//     that had not given up yet hears of it in the same moment, by the
//     reset on its own socket. The package documentation allows the next
//     holder in first by "a moment"; the suite allows 100ms.
//
// LOCKER_CHAOS_DURATION lengthens the run for a soak; LOCKER_CHAOS_SEED
// replays a failed run's faults.
func TestChaos(t *testing.T) { runChaos(t, chaos.Family{}) }

// TestChaosSemaphore and TestChaosReadWrite are TestChaos for the lock
// families, with the same faults, for 20s (room for at least one fault before the
// last 4 TTL, which are fault-free).
func TestChaosSemaphore(t *testing.T) { runChaos(t, chaos.Semaphore(2)) }
func TestChaosReadWrite(t *testing.T) { runChaos(t, chaos.ReadWrite()) }

func runChaos(t *testing.T, f chaos.Family) {
	bed := &chaosBed{}
	duration := time.Duration(0) // the suite's default
	if f != (chaos.Family{}) {
		duration = 20 * time.Second
	}
	r := chaos.Run(t, chaos.Harness{
		Family:   f,
		Duration: duration,
		TTL:      2 * chaosInterval,
		WorkerEnv: func(t *testing.T, w int) []string {
			srv := bed.server(t)
			pxAddr := bed.links.Add(t, w, srv.Addr())[0]
			return []string{chaosURLEnv + "=" + withHost(t, srv.DSN(), pxAddr, url.Values{
				"lock_health_interval": {chaosInterval.String()},
			})}
		},
		NewLocker: func(t *testing.T, w chaos.Worker) locker.Locker {
			raw := w.Env(chaosURLEnv)
			if raw == "" {
				t.Fatalf("worker %d: %s is not set", w.Index, chaosURLEnv)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := locker.Open(ctx, raw)
			if err != nil {
				t.Fatalf("worker %d: locker.Open: %v", w.Index, err)
			}
			return l
		},
		Faults: append(testserver.ServerFaults(bed.current, nil), bed.links.Faults()...),
	})
	if r == nil {
		return // a worker process
	}
	faults := 0
	for _, n := range r.Faults {
		faults += n
	}
	if r.Acquired == 0 || r.Writes == 0 || faults == 0 {
		t.Errorf("the run exercised too little: %v", r)
	}
}
