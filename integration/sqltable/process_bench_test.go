package sqltable_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/benchstats"
	"github.com/go-locker/locker/sqltable"
)

// handoffChildEnv makes the test binary the other process of
// BenchmarkProcessHandoff: it holds the URL to open; the key comes in
// handoffKeyEnv. See handoffChild.
const (
	handoffChildEnv = "LOCKER_BENCH_SQLTABLE_HANDOFF_URL"
	handoffKeyEnv   = "LOCKER_BENCH_SQLTABLE_HANDOFF_KEY"
)

// BenchmarkProcessHandoff measures the handoff between two OS processes,
// the case of separate instances of a service: a child process holds the
// key for hold while this process waits in Acquire, then releases; a sample
// is the time from just before the child's Release to this process's
// Acquire returning (both read the same wall clock, on one host). Within
// one process waiters are woken at once by the process's own releases
// (BenchmarkLock/<dialect>/Handoff); across processes a waiter learns of a release from
// PostgreSQL's NOTIFY, from the SQLite file's wake-up signal, or on MySQL
// from the holder's bell (a named lock; see TestBellAcrossProcesses).
//
//	cd integration && go test -run '^$' -bench ProcessHandoff -benchtime 20x ./sqltable
func BenchmarkProcessHandoff(b *testing.B) {
	for _, d := range dialects {
		for _, hold := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond} {
			b.Run(fmt.Sprintf("%s/hold=%v", d.name, hold), func(b *testing.B) {
				benchProcessHandoff(b, d, hold)
			})
		}
	}
}

func benchProcessHandoff(b *testing.B, d dialect, hold time.Duration) {
	ctx := context.Background()
	u := d.url(b, "", url.Values{"lock_max_conns": {"6"}})
	l := open(b, u)
	key := "bench/process-handoff/" + randomID()
	child := startHandoffChild(b, u, key)
	var samples []time.Duration
	b.ResetTimer()
	for range b.N {
		child.do(b, "A", "held")
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		var h interface{ Release(context.Context) error }
		go func() {
			hd, err := l.Acquire(ctx, key)
			if err != nil {
				errc <- err
				return
			}
			h = hd
			got <- time.Now()
		}()
		time.Sleep(hold) // the child's critical section, while we wait
		line := child.do(b, "R", "released ")
		at, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			b.Fatalf("child said %q", line)
		}
		select {
		case t1 := <-got:
			samples = append(samples, t1.Sub(time.Unix(0, at)))
		case err := <-errc:
			b.Fatal(err)
		case <-time.After(time.Minute):
			b.Fatal("no handoff within a minute of the child's release")
		}
		if err := h.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	benchstats.ReportPercentiles(b, samples)
}

type handoffChildProc struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

func startHandoffChild(b testing.TB, u, key string) *handoffChildProc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), handoffChildEnv+"="+u, handoffKeyEnv+"="+key)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return &handoffChildProc{in: in, out: bufio.NewScanner(out)}
}

// do sends cmd and returns the rest of the child's answer after prefix.
func (c *handoffChildProc) do(b testing.TB, cmd, prefix string) string {
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		b.Fatalf("child: %v", err)
	}
	if !c.out.Scan() {
		b.Fatalf("child ended: %v", c.out.Err())
	}
	rest, ok := strings.CutPrefix(c.out.Text(), prefix)
	if !ok {
		b.Fatalf("child answered %q to %s, want %q...", c.out.Text(), cmd, prefix)
	}
	return rest
}

// handoffChild is the child process of BenchmarkProcessHandoff when the
// environment names it one: it takes the key on "A" and says "held", and on
// "R" says "released <UnixNano just before Release>" and releases. It
// returns the exit code.
func handoffChild() (code int, isChild bool) {
	u := os.Getenv(handoffChildEnv)
	if u == "" {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := sqltable.Open(ctx, u)
	if err != nil {
		fmt.Fprintln(os.Stderr, "handoff child:", err)
		return 1, true
	}
	defer l.Close()
	key := os.Getenv(handoffKeyEnv)
	var h *sqltable.Handle
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "A":
			hd, err := l.Acquire(ctx, key)
			if err != nil {
				fmt.Fprintln(os.Stderr, "handoff child: Acquire:", err)
				return 1, true
			}
			h = hd.(*sqltable.Handle)
			fmt.Println("held")
		case "R":
			at := time.Now().UnixNano()
			if err := h.Release(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "handoff child: Release:", err)
				return 1, true
			}
			fmt.Printf("released %d\n", at)
		}
	}
	return 0, true
}
