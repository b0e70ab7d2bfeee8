package sqltable

import (
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

// SQLite has no way to tell another process that a row changed, so
// waiters in other processes learn of a release through a signal file
// beside the database, "<database file>-locker": every release (and every
// drop of an abandoned row) writes one byte to it, and a process whose
// Lockers use the database watches it (fsnotify: inotify on Linux, kqueue
// on the BSDs and macOS, ReadDirectoryChangesW on Windows) and, on each
// write, wakes its longest waiter of every key of the tables on that file
// that has waiters. The byte carries nothing: the woken waiters try, and
// those whose key is still held go back to sleep. The row stays the only
// truth; a lost signal (a releasing process of an older release of this
// package, a signal file nobody can write, a watch that failed) costs a
// waiter at most the retry interval, as a lost NOTIFY does on PostgreSQL.
//
// One watch per database file and process, shared by its Lockers: started
// by the first Acquire that waits, stopped when the last Locker on the
// file closes.

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
	users    int            // Lockers on the file that have not closed
	tables   map[string]int // their hub keys (see Locker.hubKey), counted
	wf       *os.File       // open for writing; nil: this process cannot signal
	watcher  *fsnotify.Watcher
	done     chan struct{} // closed when the watch goroutine has returned
	failedAt time.Time     // the last failed start of the watch
	watching atomic.Bool
}

// joinFileWake registers a Locker of table hubKey on the SQLite database
// file dbFile, and returns the file's signal; the Locker leaves it when it
// closes.
func joinFileWake(dbFile, hubKey string) *fileWake {
	path := dbFile + fileWakeSuffix
	fileWakes.mu.Lock()
	defer fileWakes.mu.Unlock()
	fw := fileWakes.m[path]
	if fw == nil {
		fw = &fileWake{path: path, tables: map[string]int{}}
		fw.wf = openSignal(dbFile, path)
		fileWakes.m[path] = fw
	}
	fw.mu.Lock()
	fw.users++
	fw.tables[hubKey]++
	fw.mu.Unlock()
	return fw
}

// openSignal opens (creating it if needed, with the database file's
// permissions) the signal file for writing; nil when it cannot.
func openSignal(dbFile, path string) *os.File {
	perm := os.FileMode(0o600)
	if fi, err := os.Stat(dbFile); err == nil {
		perm = fi.Mode().Perm()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, perm)
	if err != nil {
		return nil
	}
	return f
}

// leave unregisters a Locker of table hubKey. The last one stops the watch
// and closes the file.
func (fw *fileWake) leave(hubKey string) {
	fileWakes.mu.Lock()
	fw.mu.Lock()
	fw.users--
	if fw.tables[hubKey]--; fw.tables[hubKey] <= 0 {
		delete(fw.tables, hubKey)
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
		<-done
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
	if fw.wf != nil {
		_, _ = fw.wf.WriteAt([]byte{1}, 0)
	}
}

// up reports whether this process watches the file now.
func (fw *fileWake) up() bool { return fw != nil && fw.watching.Load() }

// ensure starts watching the file unless this process already does, and
// reports whether it does.
func (fw *fileWake) ensure() bool {
	if fw == nil {
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
	case fw.users == 0, time.Since(fw.failedAt) < fileWakeRetry:
		return false
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
// signal file, until the watcher is closed.
func (fw *fileWake) watch(w *fsnotify.Watcher, done chan struct{}) {
	defer close(done)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Chmod) {
				fw.renew(w)
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
// signal file was removed or replaced (a clean-up of the directory): a new
// file is created and watched, and the old one is let go.
func (fw *fileWake) renew(w *fsnotify.Watcher) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	cur, err := os.Stat(fw.path)
	if err == nil && fw.wf != nil {
		if mine, err := fw.wf.Stat(); err == nil && os.SameFile(cur, mine) {
			return // a change of permissions, not of the file
		}
	}
	if fw.wf != nil {
		_ = fw.wf.Close()
	}
	fw.wf = openSignal(fw.path[:len(fw.path)-len(fileWakeSuffix)], fw.path)
	_ = w.Remove(fw.path)
	_ = w.Add(fw.path)
}

// wakeAll wakes this process's longest waiter of every key of the file's
// tables.
func (fw *fileWake) wakeAll() {
	fw.mu.Lock()
	tables := make([]string, 0, len(fw.tables))
	for t := range fw.tables {
		tables = append(tables, t)
	}
	fw.mu.Unlock()
	for _, t := range tables {
		procHub.wakeTable(t)
	}
}
