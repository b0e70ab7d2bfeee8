package cli

import (
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// delegated is a subcommand that only the Full binary has: it runs that
// binary with the same arguments, flags and --help included.
func delegated(name, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(*cobra.Command, []string) error {
			return execFull("the " + name + " subcommand is")
		},
	}
}

// delegateURL runs the Full binary in place of this one when rawURL's
// scheme is one it serves and this binary does not; it returns only when
// it does not (nil) or cannot (the error).
func delegateURL(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil || !slices.Contains(config.Schemes, strings.ToLower(u.Scheme)) {
		return nil
	}
	return execFull(strings.ToLower(u.Scheme) + ":// URLs are")
}

// execFull replaces this process by the Full binary, with the same
// arguments and environment: signals, the terminal and the exit status are
// then all its own. It looks for it beside this binary, then in $PATH.
// what names what it serves, with its verb: "etcd:// URLs are".
func execFull(what string) error {
	path, err := fullPath()
	if err != nil {
		return fail(exitFailure, "%s served by %s, which is not installed beside locker nor in $PATH: go install github.com/go-locker/locker/cmd/locker/...@latest installs both", what, config.Full)
	}
	err = syscall.Exec(path, append([]string{path}, os.Args[1:]...), os.Environ())
	return fail(exitFailure, "%s served by %s, which did not run: %v", what, path, err)
}

func fullPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), config.Full)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath(config.Full)
	if err != nil {
		return "", errors.New("not found")
	}
	return p, nil
}
