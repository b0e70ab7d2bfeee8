//go:build !unix

package conformance

import (
	"os"
	"testing"
)

const canPause = false

func pauseProcess(t *testing.T, p *os.Process, stop bool) {
	t.Helper()
	t.Fatal("conformance: pausing a process is not supported on this OS")
}
