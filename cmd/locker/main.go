// Command locker runs a command while holding a distributed lock — flock(1)
// for a cluster — and shows who holds a lock.
//
//	locker run [flags] KEY -- COMMAND [ARGS...]
//	locker run [flags] KEY -c 'SHELL COMMAND'
//	locker hold [flags] KEY
//	locker status [--url URL] KEY...
//
// Locks live in the backend named by --url, or $LOCKER_URL, or else in an
// SQLite database in the user's cache directory, shared by every process of
// this user on this host (see `locker run --help` for its path). Every
// scheme the library registers is understood: redis://, rediss://,
// redlock://, postgres://, zookeeper://, etcd://, sqlite:, mysql://,
// postgres+table://.
//
// Exit status of run: the command's own status when it ran to its end; 128+N
// when it was ended by signal N; --conflict-exit-code (1) when the lock was
// held elsewhere for longer than --wait; 124 when the lock was lost while
// the command ran (the command was terminated); 125 when locker itself
// failed (bad flags, URL or key, a backend that did not answer within
// --timeout); 126 when the command could not be started; 127 when it was
// not found.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	// The backends, registered for locker.Open by their URL schemes.
	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

// Exit statuses of locker itself (the command's own pass through).
const (
	exitLost        = 124 // the lock was lost while the command ran
	exitFailure     = 125 // locker failed: bad flags, URL or key, backend unreachable
	exitCannotStart = 126 // the command was found but could not be started
	exitNotFound    = 127 // the command was not found
)

// exitError carries an exit status and the one line to print for it.
type exitError struct {
	code int
	msg  string // printed as "locker: msg" unless empty
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

// run runs the command line args and returns the exit status.
func run(args []string) int {
	root := newRootCmd()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(os.Stderr, "locker: "+oneLine(strings.TrimPrefix(ee.msg, "locker: ")))
		}
		return ee.code
	}
	// Flag and argument errors from cobra.
	fmt.Fprintln(os.Stderr, "locker: "+err.Error())
	fmt.Fprintln(os.Stderr, "Run 'locker --help' for usage.")
	return exitFailure
}

// oneLine joins the lines of a message that a client library spread over
// several (pgx lists each address it tried on a line of its own).
func oneLine(msg string) string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimSpace(msg), "\n") {
		l = strings.TrimSpace(l)
		if i > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "locker",
		Short: "Run commands under distributed locks, and see who holds them",
		Long: `locker takes distributed locks with fencing tokens on Redis, PostgreSQL,
ZooKeeper, etcd or a SQL lock table (SQLite, MySQL/MariaDB, PostgreSQL).

With no --url and no $LOCKER_URL, locks live in an SQLite database in your
cache directory: they exclude the processes of one host, with no server.`,
		Version:       version(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		// No subcommand is a usage error: the usage goes to stderr and the
		// status is not 0, so that a script's typo does not pass silently.
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(os.Stderr)
			_ = cmd.Usage()
			return &exitError{code: exitFailure}
		},
	}
	root.SetVersionTemplate("locker {{.Version}}\n")
	root.AddCommand(newRunCmd(), newHoldCmd(), newStatusCmd(), newBenchCmd())
	return root
}

// version is the module version the binary was built from ("v1.2.0" by go
// install ...@v1.2.0, "(devel)" in a checkout), with the commit when the
// build recorded it, and the Go version.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev != "" {
		v += " " + rev[:min(12, len(rev))] + dirty
	}
	return v + " " + bi.GoVersion
}
