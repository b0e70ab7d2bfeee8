package main

import (
	"bytes"
	"context"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTwoWorkers runs two workers on a memlock store of their own and on an
// SQLite lock table, and checks the shared file: every "enter" followed by
// its own "exit", tokens rising down the file, every round there. The
// integration test (integration/portability) runs the built program as two
// processes on every backend.
func TestTwoWorkers(t *testing.T) {
	for _, url := range []string{
		"mem://" + strings.ReplaceAll(t.Name(), "/", "-"),
		"sqlite://" + filepath.Join(t.TempDir(), "locks.db"),
	} {
		t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
			c := config{url: url, key: "portable/test", file: filepath.Join(t.TempDir(), "shared.log"),
				rounds: 8, workers: 2, work: 5 * time.Millisecond}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			if err := run(ctx, c, log.New(&out, "", 0)); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(out.String(), " held token="); n != c.rounds*c.workers {
				t.Errorf("%d rounds held, want %d:\n%s", n, c.rounds*c.workers, out.String())
			}
			data, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
			if len(lines) != 2*c.rounds*c.workers {
				t.Fatalf("%d lines in the shared file, want %d", len(lines), 2*c.rounds*c.workers)
			}
			var last int64
			for i := 0; i < len(lines); i += 2 {
				enter, exit := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				if len(enter) != 3 || len(exit) != 3 || enter[0] != "enter" || exit[0] != "exit" ||
					enter[1] != exit[1] || enter[2] != exit[2] {
					t.Fatalf("lines %d-%d: %q then %q, want one holder's enter and exit", i+1, i+2, lines[i], lines[i+1])
				}
				token, err := strconv.ParseInt(enter[2], 10, 64)
				if err != nil || token <= last {
					t.Fatalf("line %d: token %s after %d, want it higher", i+1, enter[2], last)
				}
				last = token
			}
		})
	}
}
