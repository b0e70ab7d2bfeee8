//go:build !unix

package main

import (
	"os"
	"os/exec"
)

func setProcessGroup(*exec.Cmd) {}

// signalGroup ends the command: other systems have no signals to pass on.
func signalGroup(c *exec.Cmd, _ os.Signal) {
	if c.Process != nil {
		_ = c.Process.Kill()
	}
}
