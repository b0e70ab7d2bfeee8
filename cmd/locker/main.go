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
// This binary links every backend but etcd, whose client's package init
// (gRPC, protobuf) would double the start of every locker run; for etcd://
// and etcds:// URLs and for locker bench it runs locker-full, its sibling
// (cmd/locker/locker-full, installed with it by
// go install github.com/go-locker/locker/cmd/locker/...@latest), in its
// place.
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

	// The backends, registered for locker.Open by their URL schemes:
	// all but etcd (see above).
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.Config{Full: "locker-full", Schemes: []string{"etcd", "etcds"}}))
}
