package redis_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// commandStats is what INFO commandstats reports: calls per command, the
// commands scripts run inside EVAL/EVALSHA included.
type commandStats map[string]int64

// readCommandStats reads INFO commandstats from the server admin talks to.
func readCommandStats(tb testing.TB, ctx context.Context, admin *goredis.Client) commandStats {
	tb.Helper()
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		tb.Fatalf("INFO commandstats: %v", err)
	}
	st := commandStats{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				st[name] = n
			}
		}
	}
	return st
}

// sub returns the calls made since before.
func (st commandStats) sub(before commandStats) commandStats {
	d := commandStats{}
	for k, v := range st {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// clientCommands counts the commands clients sent, as opposed to those
// scripts ran inside an EVAL: script calls, Pub/Sub (un)subscriptions and
// health PINGs, the eviction-policy checks, and with sets the SETs sent by
// a lock that takes its key with a SET NX of its own (the raw baseline,
// redsync; neither runs SET inside a script).
// The INFO calls of readCommandStats are not counted.
func (st commandStats) clientCommands(sets bool) int64 {
	var n int64
	for k, v := range st {
		switch {
		case k == "eval", k == "evalsha", strings.HasPrefix(k, "script|"),
			strings.HasSuffix(k, "subscribe"), k == "ping",
			strings.HasPrefix(k, "config|"), strings.HasPrefix(k, "client|"):
			n += v
		case sets && k == "set":
			n += v
		}
	}
	return n
}

// published counts the messages published (PUBLISH and SPUBLISH, from
// scripts or not): the wake-ups sent.
func (st commandStats) published() int64 { return st["publish"] + st["spublish"] }
