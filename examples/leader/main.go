// Command leader is leader election with locker.Lead: start several
// instances; one leads (it prints its term and works), the others wait. Stop
// the leader (Ctrl-C) and another takes over with a higher term token; a
// leader whose lock is lost steps down before its successor can start.
//
//	go run ./examples/leader -name a &
//	go run ./examples/leader -name b &
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
	url := flag.String("url", "sqlite://"+os.TempDir()+"/locker-leader.db", "lock backend URL")
	name := flag.String("name", fmt.Sprint(os.Getpid()), "this instance's name")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	l, err := locker.Open(ctx, *url)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	err = campaign(ctx, l, *name, func(ctx context.Context, term int64) error {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				fmt.Printf("%s: leading (term %d)\n", *name, term)
			}
		}
	}, os.Stdout)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// campaign runs work whenever this instance leads, and reports each term's
// start and end on out.
func campaign(ctx context.Context, l locker.Locker, name string, work func(ctx context.Context, term int64) error, out interface{ Write([]byte) (int, error) }) error {
	return locker.Lead(ctx, l, "leader/example", func(ctx context.Context, h locker.Handle) error {
		fmt.Fprintf(out, "%s: became leader, term %d\n", name, h.Token())
		err := work(ctx, h.Token())
		cause := context.Cause(ctx)
		if cause == nil {
			cause = errors.New("work returned")
		}
		fmt.Fprintf(out, "%s: stepped down from term %d (%v)\n", name, h.Token(), cause)
		return err
	})
}
