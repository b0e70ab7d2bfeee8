package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"github.com/spf13/cobra"

	"github.com/go-locker/locker"
)

func newHoldCmd() *cobra.Command {
	var o lockOpts
	cmd := &cobra.Command{
		Use:   "hold [flags] KEY",
		Short: "Hold the lock on KEY until SIGINT or SIGTERM, printing its fencing token",
		Long: `Hold takes the lock on KEY (waiting as --wait says), prints its fencing token on
stdout, renews its lease while it runs, and releases it when it gets SIGINT,
SIGTERM, SIGHUP or SIGQUIT, then exits 0: the lock around several steps of a
shell script, as etcdctl lock does without a command.

If the lock is lost meanwhile (the backend unreachable for longer than the
lease, the lock deleted on the server), hold says so on stderr and exits 124
at once: a script that watches hold (wait, or kill -0) can stop its steps.

Exit status: 0 after a signal released the lock; --conflict-exit-code
(default 1) if KEY stayed held elsewhere for --wait; 124 if the lock was lost;
125 if locker failed (bad flags, URL or key, a backend that did not answer
within --timeout); 128+N if signal N came while waiting for the lock.`,
		Example: `  # bash: hold "deploy" around several steps, with its token.
  coproc LOCK { locker hold --wait 5m deploy; }
  read -r token <&"${LOCK[0]}" || exit 1
  ./migrate --fencing-token "$token" && ./restart
  kill "$LOCK_PID"; wait "$LOCK_PID"`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return errors.New("missing KEY: locker hold KEY")
			case len(args) > 1:
				return fmt.Errorf("%d arguments, want one KEY: locker hold KEY (for a command, locker run KEY -- COMMAND)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return hold(cmd.Context(), o, args[0])
		},
	}
	o.flags(cmd.Flags())
	return cmd
}

// hold takes the lock on key, prints its token, and holds it until a
// signal (released, status 0) or its loss (status 124).
func hold(ctx context.Context, o lockOpts, key string) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	o.owner = o.description([]string{"locker", "hold", key})
	h, b, sigs, err := takeLock(ctx, o, key, nil)
	if err != nil {
		return err
	}
	defer signal.Stop(sigs)
	defer closeBackend(b, &err)
	if _, err := fmt.Fprintln(os.Stdout, h.Token()); err != nil {
		releaseQuietly(h)
		return fail(exitFailure, "printing the token: %v", err)
	}
	select {
	case <-sigs:
	case <-h.Done():
		return fail(exitLost, "lost the lock on %q: %v", key, h.Err())
	}
	rctx, cancel := context.WithTimeout(context.Background(), locker.ReleaseTimeout)
	defer cancel()
	if rerr := h.Release(rctx); rerr != nil {
		if errors.Is(rerr, locker.ErrLost) {
			return fail(exitLost, "the lock on %q was lost before the signal: %v", key, rerr)
		}
		return fail(exitFailure, "releasing the lock on %q: %v", key, rerr)
	}
	return nil
}
