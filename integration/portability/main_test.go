// Package portability checks the library's promise that a deployment swaps
// its backend by changing the URL and nothing else (issue 29): the same
// program, examples/portable, built once and run as two processes on every
// backend URL form the README lists, against real servers from
// integration/testserver.
package portability

import (
	"testing"

	"github.com/go-locker/locker/integration/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }
