package sqltable

import (
	"context"
	"time"

	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// fileSignal is the waker of an SQLite Locker whose waiters watch the
// database's signal file (see sqltable/sqlite, filewake.go): the watch
// wakes the waiters through procHub, as a release in this process does.
type fileSignal struct{ fs drivers.FileSignal }

func (f fileSignal) start(ctx context.Context) bool { return f.fs.Start(ctx) }
func (f fileSignal) up() bool                       { return f.fs.Up() }

// wait does not wait: the watch wakes the waiters through procHub.
func (fileSignal) wait(context.Context, *waiter, string, time.Duration) (bool, bool) {
	return false, false
}
