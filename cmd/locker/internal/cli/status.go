package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/go-locker/locker"
)

func newStatusCmd() *cobra.Command {
	var o backendOpts
	var output string
	cmd := &cobra.Command{
		Use:   "status [--url URL] KEY...",
		Short: "Show who holds keys: host, pid, start, command, fencing token and lease",
		Long: `Status asks the backend whether each KEY is held and prints, for each, who
holds it, the holder's fencing token and the lease it has left (for backends
whose locks have a lease). It takes no lock and changes nothing. The answer
may be stale the moment it is printed: it is for looking, not for deciding
who may write.

Who holds a key is what the holder said of itself when it took the lock
(locker.WithOwner): locker run and locker hold say
"host=HOST pid=PID start=UNIX-SECONDS cmd=COMMAND" (the locker process's host,
pid and start, and the command it runs), which status shows as HOST, PID,
STARTED and COMMAND; a program's own description is shown whole, quoted, as
COMMAND. It is a label, not a proof of identity. PostgreSQL keeps about the
first 50 bytes of it (the command is cut); a holder that gave none, or a lock
family's holder (--shared, --exclusive, --limit), shows "-".

Backends that cannot tell who holds a lock make status fail with status 125,
as does a backend that does not answer within --timeout (for connecting, and
for each key).`,
		Example: `  locker status backup nightly-report
  locker status --url redis://redis:6379 -o json payment/42`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, keys []string) (err error) {
			if output != "table" && output != "json" {
				return fail(exitFailure, "-o %q: want table or json", output)
			}
			if err := o.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			l, err := openBackend(ctx, o)
			if err != nil {
				return err
			}
			defer func() {
				if cerr := l.Close(); cerr != nil && err == nil {
					err = fail(exitFailure, "closing the backend: %v", cerr)
				}
			}()
			in, ok := l.Locker.(locker.Inspector)
			if !ok {
				return fail(exitFailure, "this backend (%T) cannot tell who holds a lock", l.Locker)
			}
			infos := make([]locker.LockInfo, 0, len(keys))
			for _, k := range keys {
				ictx, cancel := context.WithTimeoutCause(ctx, o.timeout, errTimeout)
				info, err := in.Inspect(ictx, k)
				cancel()
				if err != nil {
					return l.failure(ctx, ictx, fmt.Sprintf("inspecting %q", k), err)
				}
				infos = append(infos, info)
			}
			return printStatus(infos, output)
		},
	}
	o.flags(cmd.Flags(), "backend URL (default $LOCKER_URL, else the SQLite database of locker run)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

type statusJSON struct {
	Key   string  `json:"key"`
	Held  bool    `json:"held"`
	Token int64   `json:"token,omitempty"`
	TTL   float64 `json:"ttl_seconds,omitempty"`
	Lease float64 `json:"lease_seconds,omitempty"` // the full lease, where the backend can tell
	// The holder's description (LockInfo.Owner) and, when locker run or
	// hold wrote it, its fields.
	Owner   string `json:"owner,omitempty"`
	Host    string `json:"host,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Started string `json:"started,omitempty"` // RFC 3339
	Command string `json:"command,omitempty"`
}

func printStatus(infos []locker.LockInfo, output string) error {
	if output == "json" {
		out := make([]statusJSON, len(infos))
		for i, in := range infos {
			out[i] = statusJSON{Key: in.Key, Held: in.Held, Token: in.Token, TTL: in.TTL.Seconds(), Lease: in.Lease.Seconds(), Owner: in.Owner}
			if h := parseOwner(in.Owner); in.Owner != "" && h.ours {
				out[i].Host, out[i].PID, out[i].Command = h.host, h.pid, h.cmd
				if !h.start.IsZero() {
					out[i].Started = h.start.Format(time.RFC3339)
				}
			}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tHELD\tTOKEN\tLEASE LEFT\tLEASE\tHOST\tPID\tSTARTED\tCOMMAND")
	for _, in := range infos {
		token, ttl, lease := "-", "-", "-"
		host, pid, start, cmd := "-", "-", "-", "-"
		if in.Held {
			token = fmt.Sprint(in.Token)
			if in.TTL > 0 {
				ttl = in.TTL.Round(time.Millisecond).String()
			}
			if in.Lease > 0 {
				lease = in.Lease.String()
			}
			if in.Owner != "" {
				h := parseOwner(in.Owner)
				switch {
				case !h.ours:
					cmd = fmt.Sprintf("%q", h.foreign)
				default:
					host, cmd = orDash(h.host), orDash(h.cmd)
					if h.pid > 0 {
						pid = fmt.Sprint(h.pid)
					}
					if !h.start.IsZero() {
						start = h.start.Local().Format("2006-01-02 15:04:05")
					}
				}
			}
		}
		fmt.Fprintf(tw, "%q\t%v\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Key, in.Held, token, ttl, lease, host, pid, start, cmd)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
