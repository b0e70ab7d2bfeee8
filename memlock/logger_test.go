package memlock

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// syncBuffer is a bytes.Buffer safe for the watchdog's writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLoggerAtRisk: a Locker cut off from its store (the test hook) has
// its lock at risk at the next renewal, cleared at the first after the
// heal; WithLogger records both, with the key.
func TestLoggerAtRisk(t *testing.T) {
	var buf syncBuffer
	l := NewStore().NewLocker(WithLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	defer l.Close()
	ctx := context.Background()
	h, err := l.Acquire(ctx, "logged", locker.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := h.(locker.AtRisker)
	wait := func(want bool) {
		t.Helper()
		for {
			at, changed := r.AtRisk()
			if at == want {
				return
			}
			select {
			case <-changed:
			case <-h.Done():
				t.Fatalf("lock ended (%v) before AtRisk reported %t", h.Err(), want)
			}
		}
	}
	heal := l.cut()
	wait(true)
	heal()
	wait(false)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{`level=WARN msg="locker: lock at risk: renewal failed, retrying" key=logged`, `level=INFO msg="locker: lock no longer at risk: renewal succeeded" key=logged`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestQuietByDefault: without WithLogger nothing is logged, not even
// through slog's default logger.
func TestQuietByDefault(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(old)
	l := NewStore().NewLocker()
	defer l.Close()
	h, err := l.Acquire(context.Background(), "quiet", locker.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	heal := l.cut()
	r := h.(locker.AtRisker)
	for at, changed := r.AtRisk(); !at; at, changed = r.AtRisk() {
		<-changed
	}
	heal()
	_ = h.Release(context.Background())
	if buf.String() != "" {
		t.Errorf("logged without WithLogger: %s", buf.String())
	}
}
