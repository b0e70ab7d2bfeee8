// Package cli is the locker command, shared by its two binaries: locker
// (cmd/locker), which links only the SQLite backend (the default), and
// locker-full (cmd/locker/locker-full), which has every backend and
// locker bench. locker hands the URLs of the other backends and the bench
// subcommand to locker-full by exec, so that the size and the package init
// of the server clients (etcd's gRPC and protobuf registrations, go-redis,
// pgx) and of gonum/plot never weigh on the start of a locker run on the
// default, where the start is most of the time.
package cli

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
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

// ExitFailure is the status of a locker that failed: bad flags, URL or
// key, a backend that did not answer.
const ExitFailure = exitFailure

// Fail is an error that makes Main print "locker: " and the message, and
// return code.
func Fail(code int, format string, args ...any) error { return fail(code, format, args...) }

// Config is what a binary adds to the command.
type Config struct {
	// Bench is the bench subcommand, when the binary links it.
	Bench func() *cobra.Command
	// Full is the name of the binary that has what this one lacks (bench,
	// the Schemes), run in its place for them; "" in that binary itself.
	Full string
	// Schemes are the URL schemes Full serves and this binary does not.
	Schemes []string
}

var config Config

// Main runs the command line args and returns the exit status.
func Main(args []string, cfg Config) int {
	config = cfg
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
	root.AddCommand(newRunCmd(), newHoldCmd(), newStatusCmd())
	if config.Bench != nil {
		root.AddCommand(config.Bench())
	} else if config.Full != "" {
		root.AddCommand(delegated("bench", "Measure lock latency, handoff and fairness on your own backend (in "+config.Full+")"))
	}
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
