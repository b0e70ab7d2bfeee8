package sqltable

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/backend"
	"github.com/go-locker/locker/internal/lease"
	"github.com/go-locker/locker/sqltable/internal/drivers"
)

var _ locker.Locker = (*Locker)(nil)

// Locker takes locks in one lock table of one database. It is safe for
// concurrent use. Make it with New or Open, and Close it when done.
type Locker struct {
	db      *sql.DB
	ownDB   bool // opened from a URL: Close closes db too
	cfg     config
	dialect Dialect
	drv     *drivers.Driver // the dialect's driver package's hooks
	notOwn  atomic.Bool     // PostgreSQL through a wrapped driver: acquire via database/sql
	table   tableName
	st      statements
	hubKey  string // names the table in the process-wide wake-up hub
	listen  *listener
	wake    waker              // the listener, the file signal or the bell; set by New, and by init on SQLite
	fw      drivers.FileSignal // SQLite: the database file's signal to other processes; set by init
	bell    *bell              // MySQL: the named locks that wake other processes' waiters; nil if none
	pins    *pinSet            // the connections kept by the listener and the bell (see pool.go)
	pinned  atomic.Int32
	// watching: watchPool runs (while the Locker holds pins).
	watching atomic.Bool

	// life admits the calls, holds the Handles, counts what Close waits
	// for and runs Close.
	life *backend.Life[*Handle]
	// runFn and endFn are the handles' lease.RenewConfig.Go and the exit
	// of their lease.Ops.Enter, made once: a method value allocates, and
	// every acquisition would pay for it.
	runFn func(func()) bool
	endFn func()
	// endCtx ends locker.ReleaseTimeout after Close began (or when Close
	// stops waiting, Life.Abandoned): it bounds the releases Close waits
	// for, its own and those of Releases already in flight, and the
	// clean-ups.
	endCtx  context.Context
	endStop context.CancelFunc

	renewals   lease.Batcher[*Handle] // the mutex's renewals in batches (renewmany.go)
	renewTexts renewTexts             // their statements
	mariaDB    bool                   // MySQL dialect, the server is MariaDB; set by init when the bell is on (else see serverMariaDB)

	initSem chan struct{} // one schema check at a time
	inited  bool          // guarded by initSem
	ps      prepared      // set by init
	// ownerRoom is how many bytes of a holder's description the owner
	// column holds, -1 for any (set by init; see checkOwnerRoom).
	ownerRoom int

	famInited bool          // guarded by initSem
	fst       famStatements // set by famInit
	fps       famPrepared   // set by famInit

	// queued: the mutex queues its waiters (queue.go), set by init, with
	// the queue's statements.
	queued bool
	qs     queueStatements
	qmu    sync.Mutex    // guards qp
	qp     queuePrepared // prepared by queuePrepare
}

// New returns a Locker that keeps its locks in a table of db. The dialect
// is detected from db's driver (pgx's stdlib, go-sql-driver/mysql or
// modernc.org/sqlite) unless WithDialect names it; the dialect's driver
// package (sqltable/pgx, sqltable/mysql or sqltable/sqlite) must be
// imported, else the Locker fails every call with an error that names it.
// New does not contact the database: the table is created (unless
// WithoutDDL) and its schema version checked by the first call that needs
// it, which on SQLite also checks the connection's settings (see "SQLite"
// in the package documentation). The Locker does not close db.
func New(db *sql.DB, opts ...Option) *Locker {
	cfg, cfgErr := newConfig(opts)
	endCtx, endStop := context.WithCancel(context.Background())
	l := &Locker{
		db:      db,
		cfg:     cfg,
		wake:    noWaker{},
		endCtx:  endCtx,
		endStop: endStop,
		initSem: make(chan struct{}, 1),
	}
	if db == nil && cfgErr == nil {
		cfgErr = fmt.Errorf("%w: sqltable: nil *sql.DB", locker.ErrInvalidOption)
	}
	if cfgErr == nil {
		l.dialect = cfg.dialect
		if l.dialect == DialectAuto {
			l.dialect, l.drv, cfgErr = detectDialect(db)
		} else {
			l.drv, cfgErr = dialectDriver(l.dialect)
		}
	}
	if cfgErr == nil {
		l.table, _ = parseTable(cfg.table) // checked by WithTable
		cfgErr = checkTable(l.dialect, l.table)
	}
	l.life = backend.NewLife[*Handle](cfgErr)
	l.runFn, l.endFn = l.run, l.life.End
	l.renewals.Send, l.renewals.Go, l.renewals.Max = l.renewMany, l.life.Go, renewMax
	if cfgErr == nil {
		l.st = newStatements(l.dialect, l.table)
		l.hubKey = l.dialect.String() + ":" + fmt.Sprintf("%p", db) + ":" + l.table.String() // refined by init
		if l.dialect == PostgreSQL || l.dialect == MySQL {
			l.pins = joinPins(db)
		}
		l.listen = newListener(l)
		l.bell = newBell(l)
		switch {
		case l.dialect == PostgreSQL:
			l.wake = l.listen
		case l.bell != nil:
			l.wake = l.bell
		} // SQLite: init sets the file signal, once it knows the file
	}
	return l
}

// Dialect returns the SQL dialect the Locker speaks (DialectAuto when New
// could not tell).
func (l *Locker) Dialect() Dialect { return l.dialect }

// endCallCtx is ctx, also cancelled when Close's bound
// (locker.ReleaseTimeout after it began) runs out.
func (l *Locker) endCallCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.endCtx, cancel)
	return cctx, func() { stop(); cancel() }
}

// unregister forgets h: it was released or lost.
func (l *Locker) unregister(h *Handle) { l.life.Drop(h) }

// run runs f on the calling goroutine while Close counts it as active, for
// the lease keeper (renew.Config.Go): a renewal on its timer's goroutine,
// and a loss declared by Handle.Err, which must have ended the handle when
// it returns. It returns false without running f once Close no longer
// waits.
func (l *Locker) run(f func()) bool { return l.life.Run(f) }

// callCtx is ctx, also cancelled (cause locker.ErrClosed) when Close
// begins, for a call that Life.Enter did not admit; Life.Why tells its
// errors apart.
func (l *Locker) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.life.Closing(), func() { cancel(locker.ErrClosed) })
	return cctx, func() { stop(); cancel(context.Canceled) }
}
