// Command locker-full is the locker command with every backend and locker
// bench. locker, which links only SQLite, runs it in its place for the URLs
// of every other backend and for bench; it can be run by itself too, with
// the same subcommands and flags (see cmd/locker), which saves that
// hand-over on a server backend.
package main

import (
	"os"

	"github.com/go-locker/locker/cmd/locker/internal/benchcmd"
	"github.com/go-locker/locker/cmd/locker/internal/cli"

	// Every backend, registered for locker.Open by its URL schemes.
	_ "github.com/go-locker/locker/etcd"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/redis/redlock"
	_ "github.com/go-locker/locker/sqltable/mysql"
	_ "github.com/go-locker/locker/sqltable/pgx"
	_ "github.com/go-locker/locker/sqltable/sqlite"
	_ "github.com/go-locker/locker/zookeeper"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], cli.Config{Bench: benchcmd.Command}))
}
