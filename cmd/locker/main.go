// Command locker runs a command while holding a distributed lock — flock(1)
// for a cluster — and shows who holds a lock.
//
//	locker run [flags] KEY -- COMMAND [ARGS...]
//	locker run [flags] KEY -c 'SHELL COMMAND'
//	locker hold [flags] KEY
//	locker status [--url URL] KEY...
//	locker bench [--url URL] [flags]
//
// Locks live in the backend named by --url, or $LOCKER_URL, or else in an
// SQLite database in the user's cache directory, shared by every process of
// this user on this host (see `locker run --help` for its path). Every
// scheme the library registers is understood: redis://, rediss://,
// redlock://, postgres://, zookeeper://, etcd://, sqlite:, mysql://,
// postgres+table://.
//
// This binary links only the SQLite backend, the default: the start of a
// Go program grows with its size and its packages' init, and is most of a
// locker run on the default (with the server clients but etcd's linked in,
// 38.8 MB, a run took 1.4 to 1.7 times as long). For every other
// URL, and for locker bench, it runs locker-full, its sibling
// (cmd/locker/locker-full, installed with it by
// go install github.com/go-locker/locker/cmd/locker/...@latest), in its
// place: one exec more, of a small binary, before the server's round trips.
//
// Exit status of run: the command's own status when it ran to its end; 128+N
// when it was ended by signal N; --conflict-exit-code (1) when the lock was
// held elsewhere for longer than --wait; 124 when the lock was lost while
// the command ran (the command was terminated); 125 when locker itself
// failed (bad flags, URL or key, a backend that did not answer within
// --timeout); 126 when the command could not be started; 127 when it was
// not found.
package main

import (
	"os"

	"github.com/go-locker/locker/cmd/locker/internal/cli"

	// The default backend, SQLite (sqlite: URLs); locker-full has the rest.
	_ "github.com/go-locker/locker/sqltable/sqlite"
)

// fullSchemes are the URL schemes that locker-full serves and this binary
// leaves to it: every scheme of every backend but sqlite (TestFullSchemes
// checks the list against the registry of every backend). The SQL lock
// table's mysql:// and postgres+table:// are among them, though the sqltable
// package this binary links registers them: their drivers are not linked.
var fullSchemes = []string{
	"etcd", "etcds",
	"mysql",
	"postgres", "postgresql", "postgres+table", "postgresql+table",
	"redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel",
	"redlock", "rediss+redlock",
	"zookeeper", "zookeeper+tls",
}

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.Config{Full: "locker-full", Schemes: fullSchemes}))
}
