package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
)

// ErrNotReplicated is wrapped by the error of an acquisition that fewer
// replicas confirmed than WithReplicaAck asks for (the lock was given
// back), and of a renewal likewise (the renewal counts as failed).
var ErrNotReplicated = errors.New("redis: not confirmed by enough replicas")

// DefaultReplicaAckTimeout is the URL's replica_ack_timeout when
// replica_ack is given without it.
const DefaultReplicaAckTimeout = time.Second

// checkAck refuses WithReplicaAck on a client it cannot work with: a
// Cluster client (a keyless WAIT would go to a random node, not the one
// that ran the script), or a timeout that the client's ReadTimeout would
// cut short.
func (c *config) checkAck(client goredis.UniversalClient) error {
	if c.replicas == 0 {
		return nil
	}
	switch cl := client.(type) {
	case *goredis.ClusterClient:
		return fmt.Errorf("%w: redis: WithReplicaAck is not supported with a Cluster client", locker.ErrInvalidOption)
	case *goredis.Client:
		if rt := cl.Options().ReadTimeout; rt > 0 && c.ackTimeout >= rt {
			return fmt.Errorf("%w: redis: replica ack timeout %v must be below the client's ReadTimeout %v", locker.ErrInvalidOption, c.ackTimeout, rt)
		}
	}
	return nil
}

// runScript runs s with keys and args on the client of ctx (see via). With
// WithReplicaAck the script is followed by WAIT in one
// pipeline: the same connection, as WAIT needs (it waits for that
// connection's last write), and the same round trip. The script's reply
// is returned as it came; the number of replicas that confirmed is
// returned beside it (-1 without WAIT).
func (l *Locker) runScript(ctx context.Context, s *goredis.Script, keys []string, args ...any) (*goredis.Cmd, int64) {
	c := l.via(ctx)
	if l.cfg.replicas == 0 {
		return s.Run(ctx, c, keys, args...), -1
	}
	run := func(eval bool) (*goredis.Cmd, *goredis.Cmd) {
		pipe := c.Pipeline()
		var cmd *goredis.Cmd
		if eval {
			cmd = s.Eval(ctx, pipe, keys, args...)
		} else {
			cmd = s.EvalSha(ctx, pipe, keys, args...)
		}
		wait := pipe.Do(ctx, "WAIT", l.cfg.replicas, l.cfg.ackTimeout.Milliseconds())
		_, _ = pipe.Exec(ctx) // each command's error is read below
		return cmd, wait
	}
	cmd, wait := run(false)
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, wait = run(true)
	}
	if cmd.Err() != nil {
		return cmd, -1
	}
	n, err := wait.Int64()
	if err != nil {
		cmd.SetErr(fmt.Errorf("redis: WAIT after the script: %w", err))
		return cmd, -1
	}
	return cmd, n
}

// runScriptArgs is runScript with the command's arguments laid out as
// evalsha wants them.
func (l *Locker) runScriptArgs(ctx context.Context, s *goredis.Script, args []any) (*goredis.Cmd, int64) {
	c := l.via(ctx)
	if l.cfg.replicas == 0 {
		return evalsha(ctx, c, s, args), -1
	}
	n, _ := strconv.Atoi(args[2].(string))
	keys, rest := scriptKeys(args[3:3+n]), args[3+n:]
	return l.runScript(ctx, s, keys, rest...)
}

// evalsha runs s with args, its EVALSHA command: "evalsha", the script's
// SHA (an interface made once: see acquireSHA), the number of keys as a
// constant string, the keys, then the arguments. The caller makes one slice for the whole
// command, where Script.Run makes three, and passes the strings it sends
// more than once converted to interfaces once (keys.boxed, attempt.oarg):
// each conversion allocates. An uncontended Acquire and Release made 90
// allocations where a bare SET NX and INCR script and its delete made 27;
// see BENCHMARKS.md. A server that lacks the script (NOSCRIPT: restarted,
// or its scripts flushed) gets it with EVAL, as Script.Run does.
func evalsha(ctx context.Context, c goredis.UniversalClient, s *goredis.Script, args []any) *goredis.Cmd {
	cmd := c.Do(ctx, args...)
	if err := cmd.Err(); err == nil || !goredis.HasErrorPrefix(err, "NOSCRIPT") { // (HasErrorPrefix allocates)
		return cmd
	}
	n, _ := strconv.Atoi(args[2].(string))
	return s.Eval(ctx, c, scriptKeys(args[3:3+n]), args[3+n:]...)
}

// The SHAs of the scripts that evalsha runs, converted to interfaces once.
var (
	acquireSHA any = acquireScript.Hash()
	releaseSHA any = releaseScript.Hash()
)

// scriptKeys is the keys of an evalsha command as strings.
func scriptKeys(args []any) []string {
	keys := make([]string, len(args))
	for i, a := range args {
		keys[i] = a.(string)
	}
	return keys
}

// notAcked is the error of a write that got < n confirmations.
func (l *Locker) notAcked(what string, got int64) error {
	return fmt.Errorf("%w: %s: %d of the %d replicas asked for confirmed it within %v (WithReplicaAck)", ErrNotReplicated, what, got, l.cfg.replicas, l.cfg.ackTimeout)
}
