// Command cron runs a job once per tick across every instance that runs it:
// start it on several hosts (or several times on one) and each tick's job
// runs exactly once, on whichever instance takes the tick's lock first.
//
//	go run ./examples/cron -every 10s -name report &
//	go run ./examples/cron -every 10s -name report &
//
// Each tick has a key of its own (cron/NAME/TICK), taken with TryAcquire: the
// instance that gets it runs the job, the others skip the tick. The winner
// keeps the tick's lock until the tick after next starts, and an instance
// that gets a tick's lock after that tick's period is over (a slow start, a
// GC pause) skips it: so a late instance never runs a tick again once its
// winner has let the lock go. This tolerates a pause, or a clock skew between
// hosts, of up to one period; a job that must never run twice whatever the
// delay also records the ticks it ran, fenced by the token (see README). The
// job gets the lock's fencing token for its writes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/sqltable/mysql"  // mysql://
	_ "github.com/go-locker/locker/sqltable/pgx"    // postgres+table://
	_ "github.com/go-locker/locker/sqltable/sqlite" // sqlite: (the default here)
)

func main() {
	url := flag.String("url", "sqlite://"+os.TempDir()+"/locker-cron.db", "lock backend URL")
	every := flag.Duration("every", 10*time.Second, "tick period")
	name := flag.String("name", "report", "job name")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	l, err := locker.Open(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	host, _ := os.Hostname()
	me := fmt.Sprintf("%s/%d", host, os.Getpid())
	err = schedule(ctx, l, *name, *every, func(ctx context.Context, tick time.Time, h locker.Handle) error {
		fmt.Printf("%s: running %s for tick %s (token %d)\n", me, *name, tick.Format(time.TimeOnly), h.Token())
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// schedule runs job once per tick of period every (ticks aligned to the
// wall clock, so that every instance sees the same ticks), on this instance
// if it takes the tick's lock, until ctx ends.
func schedule(ctx context.Context, l locker.Locker, name string, every time.Duration, job func(ctx context.Context, tick time.Time, h locker.Handle) error) error {
	// The locks of this tick and the one before, kept so that a late
	// instance finds them taken.
	var held []tickLock
	defer func() {
		for _, t := range held {
			releaseSoon(t.h)
		}
	}()
	for {
		tick := time.Now().Truncate(every).Add(every)
		t := time.NewTimer(time.Until(tick))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		for len(held) > 0 && held[0].tick.Before(tick.Add(-every)) {
			releaseSoon(held[0].h)
			held = held[1:]
		}
		key := fmt.Sprintf("cron/%s/%d", name, tick.UnixMilli())
		h, err := l.TryAcquire(ctx, key, locker.WithTTL(max(2*every, 3*time.Second)))
		switch {
		case errors.Is(err, locker.ErrNotAcquired):
			continue // another instance has this tick
		case err != nil:
			log.Printf("cron: tick %s: %v", tick.Format(time.TimeOnly), err)
			continue
		}
		held = append(held, tickLock{tick, h})
		if time.Since(tick) >= every {
			// Too late: the tick's period is over, and its winner may
			// have let its lock go. Keep the lock (so later comers skip
			// too) and run nothing.
			continue
		}
		jctx, stop := locker.HandleContext(ctx, h)
		if err := job(jctx, tick, h); err != nil {
			log.Printf("cron: tick %s: job failed: %v", tick.Format(time.TimeOnly), err)
		}
		stop()
	}
}

// tickLock is the lock of one tick.
type tickLock struct {
	tick time.Time
	h    locker.Handle
}

func releaseSoon(h locker.Handle) {
	ctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	_ = h.Release(ctx)
}
