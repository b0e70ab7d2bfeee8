package backend

import (
	"context"
	"log/slog"
	"sync"
	"unicode/utf8"
)

// Risk is the state behind a Handle's locker.AtRisker: whether the lock is
// at risk now and a channel closed at the next change. The zero value is
// not at risk. Its methods are safe for concurrent use.
type Risk struct {
	mu      sync.Mutex
	at      bool
	changed chan struct{}
}

// AtRisk is locker.AtRisker's AtRisk.
func (r *Risk) AtRisk() (bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	return r.at, r.changed
}

// Set records whether the lock is at risk and reports whether that
// changed the answer (the caller then logs the change).
func (r *Risk) Set(at bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == at {
		return false
	}
	r.at = at
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
	return true
}

// maxKeyInLog is how much of a key a log record shows, as much as an
// error does (locker.Error).
const maxKeyInLog = 128

// LogKey is the attribute "key" of a log record about key, cut as
// locker.Error cuts it.
func LogKey(key string) slog.Attr {
	if len(key) > maxKeyInLog {
		cut := maxKeyInLog
		for cut > 0 && !utf8.RuneStart(key[cut]) {
			cut--
		}
		key = key[:cut] + "…"
	}
	return slog.String("key", key)
}

// Log is a backend's logger (WithLogger): a nil Log, or one over a nil
// logger, logs nothing.
type Log struct{ L *slog.Logger }

func (l Log) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if l.L == nil {
		return
	}
	ctx := context.Background()
	if !l.L.Enabled(ctx, level) {
		return
	}
	l.L.LogAttrs(ctx, level, msg, attrs...)
}

// Debug logs at slog.LevelDebug.
func (l Log) Debug(msg string, attrs ...slog.Attr) { l.log(slog.LevelDebug, msg, attrs...) }

// Info logs at slog.LevelInfo.
func (l Log) Info(msg string, attrs ...slog.Attr) { l.log(slog.LevelInfo, msg, attrs...) }

// Warn logs at slog.LevelWarn.
func (l Log) Warn(msg string, attrs ...slog.Attr) { l.log(slog.LevelWarn, msg, attrs...) }

// Error logs at slog.LevelError.
func (l Log) Error(msg string, attrs ...slog.Attr) { l.log(slog.LevelError, msg, attrs...) }

// Err is the attribute "err" of a log record.
func Err(err error) slog.Attr { return slog.String("err", err.Error()) }
