package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/integration/testserver"
	"github.com/go-locker/locker/postgres"
)

// startPgBouncer runs a real PgBouncer with pool_mode mode in front of the
// test server, on a free loopback port, and returns a DSN through it. It
// skips the test when no pgbouncer binary is installed. Round-robin server
// selection makes consecutive statements land on different server sessions,
// as they do on a busy pooler. Each of extra is a line added to the
// [pgbouncer] section ("key = value"), after (and so overriding) ours.
func startPgBouncer(t *testing.T, upstreamDSN, mode string, extra ...string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		t.Skip("pgbouncer is not installed (apt-get install pgbouncer): the transaction-mode pooler tests need a real one")
	}
	up, err := url.Parse(upstreamDSN)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(up.Host)
	pass, _ := up.User.Password()
	userName := up.User.Username()
	db := strings.TrimPrefix(up.Path, "/")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	dir, err := os.MkdirTemp("", "locker-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s user=%s password=%s dbname=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
server_round_robin = 1
default_pool_size = 4
logfile = %s
ignore_startup_parameters = extra_float_digits
`, db, host, port, userName, pass, db, listen, filepath.Join(dir, "users.txt"), mode, filepath.Join(dir, "pgbouncer.log"))
	for _, line := range extra {
		ini += line + "\n"
	}
	must := func(err error) {
		if err != nil {
			t.Helper()
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	must(os.WriteFile(filepath.Join(dir, "users.txt"), []byte(fmt.Sprintf("%q \"\"\n", userName)), 0o644))
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Skipf("running as root and no user to run pgbouncer as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		must(os.Chmod(dir, 0o777))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	must(cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr := fmt.Sprintf("127.0.0.1:%d", listen)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer does not listen on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// PgBouncer 1.18 keeps no named prepared statements in transaction mode:
	// pgx must use unnamed ones.
	return withHost(t, upstreamDSN, addr, url.Values{"default_query_exec_mode": {"exec"}})
}

// warmServers makes PgBouncer open n server connections, so that round robin
// has somewhere else to send the next statement.
func warmServers(t *testing.T, ctx context.Context, dsn string, n int) {
	t.Helper()
	pool := newPool(t, dsn, int32(n))
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.2)"); err != nil {
				t.Errorf("warm-up through pgbouncer: %v", err)
			}
		}()
	}
	wg.Wait()
}

// Behind a transaction-mode pooler a session lock is not held by the
// connection's session. The Locker refuses it — because the pooler was not
// declared, and also when it was wrongly declared a session pooler, because
// the next statement lands on another backend — instead of granting a lock
// that is not held, and gives the stranded lock back.
func TestTransactionPoolerDetected(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	dsn := startPgBouncer(t, srv.DSN(), "transaction")
	warmServers(t, ctx, dsn, 3)
	direct := sharedPool(t, 2)
	for _, declared := range []bool{false, true} {
		var opts []postgres.Option
		if declared {
			opts = append(opts, postgres.WithSessionPooler())
		}
		l := newLocker(t, newPool(t, dsn, 4), opts...)
		for _, try := range []bool{true, false} {
			k := testKey(t, "")
			var err error
			if try {
				_, err = l.TryAcquire(ctx, k)
			} else {
				_, err = l.Acquire(ctx, k)
			}
			if !errors.Is(err, postgres.ErrPooler) {
				t.Fatalf("declared=%v try=%v through a transaction-mode pooler: %v, want ErrPooler", declared, try, err)
			}
			t.Logf("declared=%v try=%v: %v", declared, try, err)
			var stranded int
			if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
				AND classid = $1::bigint::oid AND objid = $2::bigint::oid`, keyHalvesOf(k)...).Scan(&stranded); err != nil {
				t.Fatal(err)
			}
			if stranded != 0 {
				t.Errorf("declared=%v try=%v: the lock stayed on a server connection of the pooler", declared, try)
			}
		}
	}
}

// A session-mode pooler keeps one server session per client connection:
// declared with WithSessionPooler, locks work through it (and exclude each
// other, and survive health checks); undeclared, the Locker refuses.
func TestSessionPooler(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	dsn := startPgBouncer(t, srv.DSN(), "session")
	undeclared := newLocker(t, newPool(t, dsn, 2))
	if _, err := undeclared.TryAcquire(ctx, testKey(t, "")); !errors.Is(err, postgres.ErrPooler) {
		t.Fatalf("TryAcquire through an undeclared pooler: %v, want ErrPooler", err)
	}
	a := newLocker(t, newPool(t, dsn, 2), postgres.WithSessionPooler(), postgres.WithHealthCheckInterval(250*time.Millisecond))
	b := newLocker(t, newPool(t, dsn, 2), postgres.WithSessionPooler())
	k := testKey(t, "")
	h := mustAcquire(t, ctx, a, k)
	select {
	case <-h.Done():
		t.Fatalf("lock lost through a session pooler: %v", h.Err())
	case <-time.After(time.Second):
	}
	if _, err := b.TryAcquire(ctx, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key through the pooler: %v, want ErrNotAcquired", err)
	}
	// A wait abandoned through the pooler (which forwards the cancel
	// request) leaves nothing queued: the key is free right after release.
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := b.Acquire(wctx, k)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a short deadline through the pooler: %v", err)
	}
	mustRelease(t, ctx, h)
	h2, err := a.TryAcquire(ctx, k)
	if err != nil {
		t.Fatalf("TryAcquire after release: %v", err)
	}
	mustRelease(t, ctx, h2)
}

// Behind a session pooler that hands a server session to the next client
// without resetting it (PgBouncer with server_reset_query empty), the
// session may come with advisory locks that an earlier client left: a
// holder that died or lost its lock closed its connection, trusting its
// session to end, and the pooler kept the session, lock and all. A Locker
// refuses such a session (ErrPooler, saying what to set) rather than lock on
// it: the same key would be granted again at once, and the unlock would
// leave it held. With PgBouncer's default reset (DISCARD ALL) the lock of a
// client that went away is freed, and the next client locks as usual.
func TestSessionPoolerReset(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	direct := sharedPool(t, 2)
	for _, reset := range []bool{true, false} {
		t.Run(fmt.Sprintf("reset=%v", reset), func(t *testing.T) {
			extra := []string{"default_pool_size = 1"} // one server session: the next client gets it
			if !reset {
				extra = append(extra, "server_reset_query =")
			}
			dsn := startPgBouncer(t, srv.DSN(), "session", extra...)
			k := testKey(t, "")
			// An earlier client locks k and goes away without unlocking.
			early := newPool(t, dsn, 1)
			conn, err := early.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", postgres.AdvisoryKey("", k)); err != nil {
				t.Fatal(err)
			}
			conn.Release()
			early.Close()

			l := newLocker(t, newPool(t, dsn, 1), postgres.WithSessionPooler())
			h, err := l.TryAcquire(ctx, testKey(t, "/other"))
			if reset {
				if err != nil {
					t.Fatalf("TryAcquire through a pooler that resets sessions: %v", err)
				}
				mustRelease(t, ctx, h)
				h, err = l.TryAcquire(ctx, k)
				if err != nil {
					t.Fatalf("TryAcquire of the key a client that went away had locked, through a pooler that resets sessions: %v", err)
				}
				mustRelease(t, ctx, h)
				return
			}
			if !errors.Is(err, postgres.ErrPooler) || !strings.Contains(err.Error(), "server_reset_query") {
				t.Fatalf("TryAcquire on a server session that kept an earlier client's lock: %v, want ErrPooler naming server_reset_query", err)
			}
			t.Logf("refused: %v", err)
			// Free the stranded lock, as an operator would.
			if _, err := direct.Exec(ctx, "SELECT pg_terminate_backend($1)", holderPID(t, ctx, direct, k)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// LockTx works through the same pooler: a transaction keeps its server
// session, and its lock ends with it.
func TestLockTxThroughPooler(t *testing.T) {
	ctx := testCtx(t)
	srv := testserver.Postgres(t)
	dsn := startPgBouncer(t, srv.DSN(), "transaction")
	warmServers(t, ctx, dsn, 3)
	pool := newPool(t, dsn, 4)
	l := newLocker(t, pool)
	k := testKey(t, "")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tok, err := l.LockTx(ctx, tx, k)
	if err != nil {
		t.Fatalf("LockTx through pgbouncer: %v", err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLockTx(ctx, tx2, k); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryLockTx while another transaction holds the key: %v, want ErrNotAcquired", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tok2, err := l.TryLockTx(ctx, tx2, k)
	if err != nil {
		t.Fatalf("TryLockTx after the holder committed: %v", err)
	}
	if tok2 <= tok {
		t.Errorf("token %d not greater than %d", tok2, tok)
	}
	if err := tx2.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
}
