package benchcmd

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress reports bench's progress on stderr: a bar per case when stderr is
// a terminal, a line when a case starts and one when it ends otherwise.
// The measured goroutines only add to an atomic counter; a ticker of the
// task's own draws the bar, so drawing costs the measurement nothing.
type progress struct {
	w   io.Writer
	tty bool
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd()))}
}

// say prints one line of its own.
func (p *progress) say(format string, args ...any) {
	fmt.Fprintf(p.w, "locker: bench: "+format+"\n", args...)
}

// task is the progress of one case.
type task struct {
	p     *progress
	name  string
	n     atomic.Int64
	bar   *progressbar.ProgressBar
	stop  chan struct{}
	ended sync.WaitGroup
	once  sync.Once
	timed bool // the bar shows time; the description counts the ops
}

// count starts a task of total operations.
func (p *progress) count(name string, total int64, unit string) *task {
	t := &task{p: p, name: name}
	if !p.tty {
		p.say("%s: %d %s...", name, total, unit)
		return t
	}
	t.start(total, func() int64 { return t.n.Load() },
		progressbar.OptionShowCount(), progressbar.OptionSetItsString(unit), progressbar.OptionShowIts())
	return t
}

// timed starts a task that runs for d; the bar shows the time.
func (p *progress) timed(name string, d time.Duration) *task {
	t := &task{p: p, name: name}
	if !p.tty {
		p.say("%s: running for %v...", name, d)
		return t
	}
	begin := time.Now()
	ms := d.Milliseconds()
	t.timed = true
	t.start(ms, func() int64 { return min(time.Since(begin).Milliseconds(), ms) })
	return t
}

func (t *task) start(total int64, now func() int64, opts ...progressbar.Option) {
	opts = append([]progressbar.Option{
		progressbar.OptionSetWriter(t.p.w),
		progressbar.OptionSetDescription(fmt.Sprintf("%-12s", t.name)),
		progressbar.OptionSetWidth(30),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionThrottle(0),
	}, opts...)
	t.bar = progressbar.NewOptions64(total, opts...)
	t.stop = make(chan struct{})
	t.ended.Add(1)
	go func() {
		defer t.ended.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
				if t.timed {
					t.bar.Describe(fmt.Sprintf("%-12s %7d ops", t.name, t.n.Load()))
				}
				_ = t.bar.Set64(now())
			}
		}
	}()
}

// add counts n operations done.
func (t *task) add(n int64) { t.n.Add(n) }

// end stops drawing and clears the bar. It may be called more than once.
func (t *task) end() {
	t.once.Do(func() {
		if t.bar == nil {
			return
		}
		close(t.stop)
		t.ended.Wait()
		_ = t.bar.Clear()
		_ = t.bar.Exit()
	})
}

// done ends the task with a summary line.
func (t *task) done(summary string) {
	t.end()
	t.p.say("%s: %s", t.name, summary)
}
