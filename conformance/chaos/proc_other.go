//go:build !linux

package chaos

import "os/exec"

// killWithParent does nothing here: only Linux kills a child with its
// parent; a worker left behind by a crashed test process ends when its
// stdin closes (not if it is stopped).
func killWithParent(*exec.Cmd) {}
