// Package exiting is how a program that is about to exit tells the
// backends so: what they would close only for the operating system to
// free a moment later, and what costs the exit time, they may leave open.
// The locker command says so before it closes its Locker (see
// sqltable/sqlite: the database's last connection, whose close
// checkpoints the WAL, two disk syncs, and makes the next process's first
// write start the WAL again, two more).
//
// Only a process that exits right after may call Begin: a Locker closed
// after it may leave connections, file descriptors and locks held until
// the process ends.
package exiting

import "sync/atomic"

var begun atomic.Bool

// Begin says the process exits once the Lockers it closes from now on are
// closed.
func Begin() { begun.Store(true) }

// Now reports whether Begin was called.
func Now() bool { return begun.Load() }
