package main

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// go-redis logs its failed dials to stderr by itself, several lines per
// failure, before the error reaches locker; locker's promise is one clear
// line (the error, which says the same), so the command silences that log.
// Only the program may: a library must not change go-redis's global logger.
// Here, in the one binary that links go-redis: in package cli it would
// link go-redis (and crypto/tls, for its TLS dials) into locker too.
func init() { goredis.SetLogger(silentLogger{}) }

type silentLogger struct{}

func (silentLogger) Printf(context.Context, string, ...any) {}
