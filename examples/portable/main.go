// Command portable takes locks the way a program that must run on any backend
// does: the backend is named only by the URL in $LOCKER_URL, and the program
// uses nothing but locker.Open, locker.Do, locker.TryDo and locker.WithTTL.
// The same binary runs unchanged on every backend the library has; start it
// twice on one URL and the two processes never hold the lock at once:
//
//	export LOCKER_URL=redis://127.0.0.1:6379   # or etcd://, postgres://, sqlite:///tmp/locks.db, ...
//	go build -o /tmp/portable ./examples/portable
//	/tmp/portable -rounds 20 & /tmp/portable -rounds 20; wait
//
// Each round tries the key once (TryDo); when another process holds it
// (ErrNotAcquired) the round says so and waits its turn (Do). Holding the
// lock, it writes an "enter" and an "exit" line with its fencing token to a
// shared file, the resource the lock protects: with one holder at a time,
// every "enter" in the file is followed by its own "exit", and the tokens
// rise down the file. Per round it prints a line such as
//
//	worker=4711.0 round=3 busy
//	worker=4711.0 round=3 held token=42 lease=5s via=wait
//
// where lease is the lease the backend gave for the 5s asked (Handle.TTL):
// the TTL itself, or the nearest the server can do (see README, "One TTL, the
// same everywhere").
//
// mem:// locks are shared only within one process: -workers 2 runs two
// workers in this process, each with a Locker of its own, as two processes
// would be on the other backends.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-locker/locker"

	// Every backend, registered for locker.Open by its URL schemes, as the
	// locker command has them: the URL alone picks one.
	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/memlock"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/zookeeper"
	// The lock table: each database driver registers its URL schemes
	// (sqlite://, mysql://, postgres+table://); a program imports those it
	// uses.
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
)

// config is what the flags set.
type config struct {
	url     string        // the backend, from $LOCKER_URL
	key     string        // the lock every worker takes
	file    string        // the shared file the lock protects
	rounds  int           // rounds per worker
	workers int           // workers in this process
	work    time.Duration // how long each round holds the lock
}

func main() {
	c := config{url: os.Getenv("LOCKER_URL")}
	flag.StringVar(&c.key, "key", "portable/demo", "the lock key")
	flag.StringVar(&c.file, "file", filepath.Join(os.TempDir(), "locker-portable.log"), "the shared file the lock protects")
	flag.IntVar(&c.rounds, "rounds", 10, "rounds per worker")
	flag.IntVar(&c.workers, "workers", 1, "workers in this process, each with a Locker of its own")
	flag.DurationVar(&c.work, "work", 20*time.Millisecond, "how long each round holds the lock")
	flag.Parse()
	if c.url == "" {
		log.Fatal("portable: set LOCKER_URL, for example LOCKER_URL=sqlite:///tmp/locks.db")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, log.New(os.Stdout, "", 0)); err != nil {
		log.Fatalf("portable: %v", err)
	}
}

// run runs c.workers workers until each has done its rounds, or one fails.
func run(ctx context.Context, c config, out *log.Logger) error {
	f, err := os.OpenFile(c.file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, c.workers)
	var wg sync.WaitGroup
	for i := range c.workers {
		wg.Go(func() {
			errs[i] = worker(ctx, c, fmt.Sprintf("%d.%d", os.Getpid(), i), f, out)
			if errs[i] != nil {
				cancel() // one failed: stop the others
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// worker opens a Locker of its own and takes the lock c.rounds times.
func worker(ctx context.Context, c config, name string, f *os.File, out *log.Logger) error {
	l, err := locker.Open(ctx, c.url)
	if err != nil {
		return err
	}
	defer l.Close()
	for round := 1; round <= c.rounds; round++ {
		via := "try"
		critical := func(ctx context.Context, h locker.Handle) error {
			out.Printf("worker=%s round=%d held token=%d lease=%s via=%s", name, round, h.Token(), h.TTL(), via)
			return write(ctx, f, name, h.Token(), c.work)
		}
		err := locker.TryDo(ctx, l, c.key, critical, locker.WithTTL(5*time.Second))
		if errors.Is(err, locker.ErrNotAcquired) {
			// Another process holds the key (any other error is a
			// failure, never "taken"): wait for it.
			out.Printf("worker=%s round=%d busy", name, round)
			via = "wait"
			err = locker.Do(ctx, l, c.key, critical, locker.WithTTL(5*time.Second))
		}
		if err != nil {
			return fmt.Errorf("worker %s, round %d: %w", name, round, err)
		}
	}
	return nil
}

// write is the work the lock protects: an "enter" line, c.work of work, an
// "exit" line, each line with the holder's fencing token and appended in one
// write (O_APPEND keeps lines whole between processes). A real resource
// would refuse a token lower than one it has seen; here the lines let anyone
// check that holders never overlapped.
func write(ctx context.Context, f *os.File, name string, token int64, work time.Duration) error {
	if _, err := fmt.Fprintf(f, "enter %s %d\n", name, token); err != nil {
		return err
	}
	select {
	case <-ctx.Done(): // the lock was lost (or we were interrupted): stop
		return context.Cause(ctx)
	case <-time.After(work):
	}
	_, err := fmt.Fprintf(f, "exit %s %d\n", name, token)
	return err
}
