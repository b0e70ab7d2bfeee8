//go:build unix

package conformance

import (
	"os"
	"syscall"
	"testing"
)

const canPause = true

// pauseProcess stops (SIGSTOP) or continues (SIGCONT) p.
func pauseProcess(t *testing.T, p *os.Process, stop bool) {
	t.Helper()
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if err := p.Signal(sig); err != nil {
		t.Fatalf("conformance: signal %v to the child process: %v", sig, err)
	}
}
