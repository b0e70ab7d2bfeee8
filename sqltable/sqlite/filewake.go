package sqlite

import (
	"context"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/go-locker/locker/sqltable/internal/drivers"
)

// SQLite has no way to tell another process that a row changed, so
// waiters in other processes learn of a release through a signal file
// beside the database, "<database file>-locker": every release (and every
// drop of an abandoned row) writes one byte to it, and a process whose
// Lockers wait on the database (WithNotify on) watches it (fsnotify:
// inotify on Linux, kqueue on the BSDs and macOS; not on Windows, see
// below) and, on each write, wakes its longest waiter of every key of the
// tables on that file that has waiters. The byte carries nothing: the
// woken waiters try, and those whose key is still held go back to sleep.
// The row stays the only truth; a lost signal (a releasing process of an older release of this
// package, a signal file nobody can write, a watch that failed) costs a
// waiter at most the retry interval, as a lost NOTIFY does on PostgreSQL.
//
// Every Locker on a database file writes the signal, whatever its options,
// so that its releases reach the waiters of other processes; WithNotify
// only decides whether its own waiters watch. One watch per database file
// and process, shared by its Lockers: started by the first Acquire that
// waits, stopped when the last Locker on the file closes.
//
// Each write wakes one waiter of every waited key of the file in every
// watching process (the releasing one included), not only the freed key's:
// a byte that named the key could be overwritten by another process's
// before it is read, and a lost wake-up costs a retry interval. Those
// waiters try once and sleep again, so a release costs a try per waited
// key and watching process.
//
// Not on Windows, where a file written through a handle that stays open
// reports its change once, not per write (fsnotify issues 432 and 570), so
// waiters would miss all but the first release: its waiters keep the
// back-off (its releases still write the signal).

// fileWakeSuffix names the signal file: the database file's name plus it.
const fileWakeSuffix = "-locker"

// fileWakeRetry is how long after a failed start of the watch the next
// waiter tries again (until then waiters use the back-off).
const fileWakeRetry = 5 * time.Second

// fileWakes are the signal files of this process, by path.
var fileWakes = struct {
	mu sync.Mutex
	m  map[string]*fileWake
}{m: map[string]*fileWake{}}

// fileWake is one signal file and this process's watch of it.
type fileWake struct {
	path string

	mu       sync.Mutex
	users    int                // Lockers on the file that have not closed
	tables   map[string]int     // wake-up identities (sqltable's Locker.hubKey) of those that watch (WithNotify), counted
	wake     func(table string) // wakes this process's waiters of a table: sqltable's hub
	wf       *os.File           // open for writing; nil: this process cannot signal
	wfInfo   os.FileInfo        // wf's, to see that the path still names it
	watcher  *fsnotify.Watcher
	done     chan struct{} // closed when the watch goroutine has returned
	failedAt time.Time     // the last failed start of the watch
	watching atomic.Bool
}

// member is one Locker's membership of a signal file.
type member struct {
	fw    *fileWake
	table string
	watch bool
	once  sync.Once
}

func (m *member) Signal()                        { m.fw.signal() }
func (m *member) Start(ctx context.Context) bool { return m.fw.start(ctx) }
func (m *member) Up() bool                       { return m.fw.up() }
func (m *member) Leave()                         { m.once.Do(func() { m.fw.leave(m.table, m.watch) }) }

// joinFileSignal registers a Locker of table (its wake-up identity) on the
// SQLite database file dbFile, and returns its membership of the file's
// signal; the Locker leaves it when it closes. With watch, the Locker's
// waiters are woken (wake(table)) by the signal.
func joinFileSignal(dbFile, table string, watch bool, wake func(table string)) drivers.FileSignal {
	return &member{fw: joinFileWake(dbFile, table, watch, wake), table: table, watch: watch}
}

// joinFileWake registers a Locker of table hubKey on the SQLite database
// file dbFile, and returns the file's signal; the Locker leaves it when it
// closes. With watch, the Locker's waiters are woken by the signal.
func joinFileWake(dbFile, hubKey string, watch bool, wake func(table string)) *fileWake {
	path := dbFile + fileWakeSuffix
	fileWakes.mu.Lock()
	defer fileWakes.mu.Unlock()
	fw := fileWakes.m[path]
	if fw == nil {
		fw = &fileWake{path: path, tables: map[string]int{}, wake: wake}
		fw.reopen()
		fileWakes.m[path] = fw
	}
	fw.mu.Lock()
	fw.users++
	if watch {
		fw.tables[hubKey]++
	}
	fw.mu.Unlock()
	return fw
}

// reopen opens the signal file at fw.path for writing, creating it if
// needed. fw.mu is held (or fw is not shared yet).
func (fw *fileWake) reopen() {
	if fw.wf != nil {
		_ = fw.wf.Close()
	}
	fw.wf, fw.wfInfo = openSignal(fw.path[:len(fw.path)-len(fileWakeSuffix)], fw.path), nil
	if fw.wf != nil {
		fw.wfInfo, _ = fw.wf.Stat()
	}
}

// current reports whether the path still names the file fw.wf writes.
// fw.mu is held.
func (fw *fileWake) current() bool {
	if fw.wf == nil || fw.wfInfo == nil {
		return false
	}
	fi, err := os.Stat(fw.path)
	return err == nil && os.SameFile(fi, fw.wfInfo)
}

// openSignal opens (creating it if needed, with the database file's
// permissions) the signal file for writing; nil when it cannot.
func openSignal(dbFile, path string) *os.File {
	perm := os.FileMode(0o600)
	if fi, err := os.Stat(dbFile); err == nil {
		perm = fi.Mode().Perm()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err == nil {
		// The umask may have taken bits the database file has (a group
		// that shares it): those processes must be able to write here.
		_ = f.Chmod(perm)
		return f
	}
	f, err = os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return nil
	}
	return f
}

// leave unregisters a Locker of table hubKey. The last one stops the watch
// and closes the file.
func (fw *fileWake) leave(hubKey string, watch bool) {
	fileWakes.mu.Lock()
	fw.mu.Lock()
	fw.users--
	if watch {
		if fw.tables[hubKey]--; fw.tables[hubKey] <= 0 {
			delete(fw.tables, hubKey)
		}
	}
	last := fw.users == 0
	var w *fsnotify.Watcher
	var done chan struct{}
	if last {
		delete(fileWakes.m, fw.path)
		w, done = fw.watcher, fw.done
		fw.watcher = nil
		fw.watching.Store(false)
	}
	fw.mu.Unlock()
	fileWakes.mu.Unlock()
	if !last {
		return
	}
	if w != nil {
		_ = w.Close()
	}
	if done != nil {
		<-done // also a watch that stopped itself and is ending
	}
	fw.mu.Lock()
	if fw.wf != nil {
		_ = fw.wf.Close()
		fw.wf = nil
	}
	fw.mu.Unlock()
}

// signal tells the waiters of every process on the file that a lock was
// freed.
func (fw *fileWake) signal() {
	if fw == nil {
		return
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	// A process that never waits does not watch, so it learns here that
	// the file was removed or replaced (a clean-up of the directory).
	if !fw.current() {
		fw.reopen()
	}
	if fw.wf != nil {
		_, _ = fw.wf.WriteAt([]byte{1}, 0)
	}
}

// up reports whether this process watches the file now.
func (fw *fileWake) up() bool { return fw != nil && fw.watching.Load() }

// start starts watching the file unless this process already does, and
// reports whether it does.
func (fw *fileWake) start(context.Context) bool {
	if fw == nil || runtime.GOOS == "windows" {
		return false
	}
	if fw.watching.Load() {
		return true
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	switch {
	case fw.watcher != nil:
		return true
	case fw.users == 0, len(fw.tables) == 0, time.Since(fw.failedAt) < fileWakeRetry:
		return false
	case fw.done != nil:
		select {
		case <-fw.done: // a watch that stopped itself (see renew) has ended
		default:
			return false
		}
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(fw.path); err != nil {
			_ = w.Close()
		}
	}
	if err != nil {
		fw.failedAt = time.Now()
		return false
	}
	fw.watcher, fw.done = w, make(chan struct{})
	fw.watching.Store(true)
	go fw.watch(w, fw.done)
	return true
}

// watch wakes the waiters of the file's tables on every change of the
// signal file, until the watcher is closed or the file can no longer be
// watched (see renew).
func (fw *fileWake) watch(w *fsnotify.Watcher, done chan struct{}) {
	defer close(done)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Chmod) {
				if !fw.renew(w, ev.Op == fsnotify.Chmod) {
					fw.wakeAll() // waiters back off from now on
					return
				}
			}
		case _, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow of the event queue, say: events were lost.
		}
		fw.wakeAll()
	}
}

// renew makes the watch and the writer follow the path again when the
// signal file was removed, renamed or replaced (a clean-up of the
// directory): a new file is created if needed and watched, and the old one
// is let go. On Linux an unlink shows first as a Chmod (the link count
// changed; the Remove comes only once every descriptor of the file is
// closed, and this process holds one). A pure Chmod of the file still
// watched changes nothing. It reports false when the file can no longer be
// watched: the watch is then stopped, and waiters use the back-off until
// start starts a new one.
func (fw *fileWake) renew(w *fsnotify.Watcher, chmod bool) bool {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	same := fw.current()
	if chmod && same {
		return true
	}
	if !same {
		fw.reopen()
	}
	_ = w.Remove(fw.path)
	if err := w.Add(fw.path); err != nil {
		_ = w.Close()
		if fw.watcher == w {
			fw.watcher = nil
			fw.watching.Store(false)
			fw.failedAt = time.Now()
		}
		return false
	}
	return true
}

// wakeAll wakes this process's longest waiter of every key of the file's
// tables.
func (fw *fileWake) wakeAll() {
	fw.mu.Lock()
	tables := make([]string, 0, len(fw.tables))
	for t := range fw.tables {
		tables = append(tables, t)
	}
	wake := fw.wake
	fw.mu.Unlock()
	for _, t := range tables {
		wake(t)
	}
}
