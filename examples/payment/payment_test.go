package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/examples/payment/shop"
)

// testService runs the service on SQLite files in dir.
func testService(t testing.TB, dir string) (*shop.Service, *httptest.Server) {
	ctx := context.Background()
	locks, err := locker.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locks.Close() })
	db, err := shop.OpenDB(filepath.Join(dir, "payments.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	s, err := shop.New(ctx, locks, db, shop.NewProvider())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddOrder(ctx, "42", 1000); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

func pay(t testing.TB, srv *httptest.Server, id string) (int, map[string]any) {
	resp, err := http.Post(srv.URL+"/orders/"+id+"/pay", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func chargeRows(t testing.TB, s *shop.Service) (n int, token int64) {
	if err := s.DB.QueryRow(`SELECT count(*), coalesce(max(token), 0) FROM charges WHERE order_id = '42'`).Scan(&n, &token); err != nil {
		t.Fatal(err)
	}
	return n, token
}

// TestManyClicksOneCharge fires many concurrent clicks for one order:
// exactly one charges it (201), the others get 409 while it is being
// charged or 200 "already paid" after.
func TestManyClicksOneCharge(t *testing.T) {
	s, srv := testService(t, t.TempDir())
	const clicks = 40
	codes := make(chan int, clicks)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range clicks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			code, _ := pay(t, srv, "42")
			codes <- code
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[http.StatusCreated] != 1 || count[http.StatusCreated]+count[http.StatusConflict]+count[http.StatusOK] != clicks {
		t.Fatalf("status counts %v: want exactly one 201, the rest 409 or 200", count)
	}
	if n, _ := chargeRows(t, s); n != 1 || s.Provider.Charged() != 1 {
		t.Fatalf("%d charge rows, %d provider charges; want 1 and 1", n, s.Provider.Charged())
	}
	if code, body := pay(t, srv, "42"); code != http.StatusOK {
		t.Errorf("a click after payment: %d %v, want 200 already paid", code, body)
	}
}

// TestStaleHolderCannotOverwrite: a holder process is stopped (SIGSTOP, as
// a GC pause or a frozen VM would) past its lease; another instance takes
// the lock with a higher token and charges the order; the stale holder
// resumes and tries to write with its old token: the fence refuses it.
func TestStaleHolderCannotOverwrite(t *testing.T) {
	if os.Getenv("PAYMENT_STALE_CHILD") != "" {
		staleChild()
		return
	}
	dir := t.TempDir()
	s, srv := testService(t, dir)

	child := exec.Command(os.Args[0], "-test.run=^TestStaleHolderCannotOverwrite$")
	child.Env = append(os.Environ(), "PAYMENT_STALE_CHILD="+dir)
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "token ") {
		t.Fatalf("child: %q, %v", line, err)
	}
	staleToken, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "token ")), 10, 64)

	// Freeze the holder. Its 1s lease runs out on the lock table's clock;
	// until then every click is refused with 409.
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var newToken int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body := pay(t, srv, "42")
		if code == http.StatusCreated {
			newToken = int64(body["token"].(float64))
			break
		}
		if code != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("click while the holder is frozen: %d %v", code, body)
		}
		time.Sleep(50 * time.Millisecond) // a user clicking again
	}
	if newToken <= staleToken {
		t.Fatalf("new holder's token %d not above the frozen holder's %d", newToken, staleToken)
	}

	// Thaw the stale holder and let it write with its old token.
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	line, _ = rd.ReadString('\n')
	if !strings.Contains(line, shop.ErrStale.Error()) {
		t.Fatalf("stale holder's write: %q, want it refused as stale", line)
	}
	if n, tok := chargeRows(t, s); n != 1 || tok != newToken {
		t.Fatalf("%d charge rows (token %d), want 1 by the new holder's token %d", n, tok, newToken)
	}
	var fence int64
	var status string
	if err := s.DB.QueryRow(`SELECT status, fence FROM orders WHERE id = '42'`).Scan(&status, &fence); err != nil {
		t.Fatal(err)
	}
	if status != "paid" || fence != newToken {
		t.Fatalf("order %s with fence %d, want paid by token %d", status, fence, newToken)
	}
}

// staleChild takes the order's lock with a 1s lease, reports its token, and
// waits; when told to go (after being frozen and thawed) it writes as if it
// still held the lock — a paused process does not know it was paused.
func staleChild() {
	dir := os.Getenv("PAYMENT_STALE_CHILD")
	ctx := context.Background()
	locks, err := locker.Open(ctx, "sqlite://"+filepath.Join(dir, "locks.db"))
	if err != nil {
		fmt.Println("error", err)
		return
	}
	db, err := shop.OpenDB(filepath.Join(dir, "payments.db"))
	if err != nil {
		fmt.Println("error", err)
		return
	}
	s := &shop.Service{Locks: locks, DB: db, Provider: shop.NewProvider()}
	h, err := locks.TryAcquire(ctx, "payment/42", locker.WithTTL(time.Second))
	if err != nil {
		fmt.Println("error", err)
		return
	}
	// It has checked the order — open, to be paid — when it is frozen.
	amount, err := s.Payable(ctx, "42")
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("token", h.Token())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	if err := s.Charge(ctx, "42", amount, h.Token()); err != nil {
		fmt.Println("pay:", err)
	} else {
		fmt.Println("pay: ok")
	}
}
