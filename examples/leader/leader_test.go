package main

import (
	"context"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

type term struct {
	who        int
	token      int64
	start, end time.Time
}

// TestOneLeaderAtATime runs three candidates on one SQLite lock database,
// stops each leader in turn, and checks that terms never overlap and that
// their tokens grow.
func TestOneLeaderAtATime(t *testing.T) {
	url := "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
	var mu sync.Mutex
	var terms []term
	started := make(chan int, 10)
	cancels := make([]context.CancelFunc, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		l, err := locker.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = campaign(ctx, l, "", func(ctx context.Context, token int64) error {
				tm := term{who: i, token: token, start: time.Now()}
				started <- i
				<-ctx.Done()
				tm.end = time.Now()
				mu.Lock()
				terms = append(terms, tm)
				mu.Unlock()
				return nil
			}, io.Discard)
		}()
	}
	// Depose the leaders one after another: each time the next one must
	// take over.
	for range 3 {
		select {
		case who := <-started:
			cancels[who]()
		case <-time.After(20 * time.Second):
			t.Fatal("no leader took over")
		}
	}
	wg.Wait()
	if len(terms) != 3 {
		t.Fatalf("%d terms, want 3", len(terms))
	}
	for i := 1; i < len(terms); i++ {
		a, b := terms[i-1], terms[i]
		if b.token <= a.token {
			t.Errorf("term %d token %d not above the previous term's %d", i, b.token, a.token)
		}
		if b.start.Before(a.end) {
			t.Errorf("term %d (leader %d) started %v before the previous term (leader %d) ended", i, b.who, a.end.Sub(b.start), a.who)
		}
	}
}
