package testserver

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// Main runs the tests and then removes every container this test binary started, also
// when tests failed; on SIGINT or SIGTERM it removes them before exiting. Call it from
// TestMain:
//
//	func TestMain(m *testing.M) { testserver.Main(m) }
//
// A binary that panics or hits -timeout cannot run it: the next test binary that
// starts a container removes what dead binaries left, and so does `make test` at its
// end (scripts/with-servers.sh).
func Main(m *testing.M) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s, ok := <-sig
		if !ok {
			return
		}
		removeAll()
		signal.Reset(s)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Signal(s)
		}
		os.Exit(1)
	}()
	code := m.Run()
	signal.Stop(sig)
	close(sig)
	removeAll()
	tlsDirs.removeAll()
	os.Exit(code)
}
