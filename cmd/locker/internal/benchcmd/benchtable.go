package benchcmd

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-locker/locker/internal/benchstats"
)

// intList is a flag of comma-separated integers; the empty string is none.
type intList []int

func (l *intList) String() string {
	s := make([]string, len(*l))
	for i, n := range *l {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var ns []int
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("%q is not a comma-separated list of integers", v)
		}
		ns = append(ns, n)
	}
	*l = ns
	return nil
}

func (l *intList) Type() string { return "ints" }

// caseResult is what one case measured.
type caseResult struct {
	name    string
	what    string // what its latency is, for the plot's legend
	clients int
	lat     []time.Duration // sorted
	elapsed time.Duration
	ops     int   // operations counted for ops/s
	share   []int // acquisitions per client, where fairness means something
}

// opsPerSec is the case's operations per second of its running time.
func (r *caseResult) opsPerSec() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// shares is the least and greatest share of the acquisitions a client had.
func (r *caseResult) shares() (lo, hi float64, ok bool) {
	total := 0
	for _, n := range r.share {
		total += n
	}
	if len(r.share) == 0 || total == 0 {
		return 0, 0, false
	}
	return float64(slices.Min(r.share)) / float64(total), float64(slices.Max(r.share)) / float64(total), true
}

// printBench writes the table of results.
func printBench(w io.Writer, results []*caseResult) error {
	// Numbers align right; the case names, padded here, left.
	width := len("CASE")
	for _, r := range results {
		width = max(width, len(r.name))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tCLIENTS\tOPS\tP50\tP90\tP99\tMAX\tOPS/S\tSHARE MIN\tSHARE MAX\t\n", width, "CASE")
	for _, r := range results {
		p := func(q float64) string { return fmtLatency(benchstats.Percentile(r.lat, q)) }
		lo, hi := "-", "-"
		if a, b, ok := r.shares(); ok {
			lo, hi = fmt.Sprintf("%.1f%%", 100*a), fmt.Sprintf("%.1f%%", 100*b)
		}
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%s\t%s\t%s\t%s\t%.0f\t%s\t%s\t\n", width, r.name, r.clients, len(r.lat),
			p(0.5), p(0.9), p(0.99), p(1), r.opsPerSec(), lo, hi)
	}
	return tw.Flush()
}

// fmtLatency prints d with three significant digits or so.
func fmtLatency(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}
