package benchcmd

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/internal/benchstats"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// cdfPoints is the most points drawn per case: enough for a smooth curve,
// few enough for a small SVG however many operations ran.
const cdfPoints = 1000

// writePlot draws the latency distribution of every case, a line per case
// with latency on a log scale in milliseconds, in two panels: above, the
// share of operations that took at most x (the CDF: medians and the body);
// below, on a log scale, the share that took at least x (the tail: p99,
// p99.9 and the maximum, squeezed into the CDF's top edge). The title runs
// across the top, and the legend, which names the cases of both panels
// (each case has one colour and dash in both), has a row of its own under
// them: inside a panel it would cover some case's curve, whatever the
// corner. It writes the picture to w as PNG or SVG, as name's extension
// says.
func writePlot(w io.Writer, name, title string, results []*caseResult) error {
	format, err := plotFormat(name)
	if err != nil {
		return err
	}
	body, tail := plot.New(), plot.New()
	body.Title.Text = "body: share of operations that took at most x"
	tail.Title.Text = "tail: share of operations that took at least x (log scale)"
	body.Y.Label.Text = "share ≤ x"
	body.Y.Min, body.Y.Max = 0, 1
	body.Y.Tick.Marker = plot.ConstantTicks{
		{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"}, {Value: 0.5, Label: "0.5 (p50)"},
		{Value: 0.75, Label: "0.75"}, {Value: 0.9, Label: "0.9 (p90)"}, {Value: 1, Label: "1"},
	}
	tail.Y.Label.Text = "share ≥ x (log)"
	tail.Y.Scale = plot.LogScale{}
	most := 1
	for _, r := range results {
		most = max(most, len(r.lat))
	}
	tail.Y.Min, tail.Y.Max = math.Pow10(-int(math.Ceil(math.Log10(float64(most))))), 1
	var tailTicks plot.ConstantTicks
	for e, label := range []string{"1", "0.1 (p90)", "0.01 (p99)", "0.001 (p99.9)", "1e-4", "1e-5", "1e-6", "1e-7"} {
		if v := math.Pow10(-e); v >= tail.Y.Min {
			tailTicks = append(tailTicks, plot.Tick{Value: v, Label: label})
		}
	}
	tail.Y.Tick.Marker = tailTicks
	for _, p := range []*plot.Plot{body, tail} {
		p.Title.Padding = vg.Points(6)
		p.X.Label.Text = "latency x (ms, log scale)"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = msTicks{}
		grid := plotter.NewGrid()
		grid.Vertical.Color = plotutil.Color(7)
		grid.Horizontal.Color = plotutil.Color(7)
		grid.Vertical.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		grid.Horizontal.Dashes = grid.Vertical.Dashes
		p.Add(grid)
	}
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.Padding = vg.Points(3)
	legend.ThumbnailWidth = vg.Points(30)
	for i, r := range results {
		if len(r.lat) == 0 {
			continue
		}
		legend.Add(fmt.Sprintf("%s: %s (n=%d, p50 %s, p99 %s, max %s)", r.name, r.what, len(r.lat),
			fmtLatency(benchstats.Percentile(r.lat, 0.5)), fmtLatency(benchstats.Percentile(r.lat, 0.99)),
			fmtLatency(benchstats.Percentile(r.lat, 1))), addLine(body, i, cdf(r.lat)))
		addLine(tail, i, ccdf(r.lat))
	}

	c, err := draw.NewFormattedCanvas(10*vg.Inch, 9*vg.Inch, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	pad := vg.Points(8)
	// The title, across the top.
	ts := body.Title.TextStyle
	ts.XAlign, ts.YAlign = draw.XCenter, draw.YTop
	dc.FillText(ts, vg.Point{X: (dc.Min.X + dc.Max.X) / 2, Y: dc.Max.Y - pad}, title)
	titleH := ts.Rectangle(title).Size().Y + 2*pad
	// The legend, under the panels, indented to the panels' left edge.
	legendH := legend.Rectangle(dc).Size().Y + 2*pad
	legendArea := draw.Crop(dc, 2*pad+vg.Points(40), 0, pad, -(dc.Size().Y - legendH))
	legend.Draw(legendArea)
	// The panels between, one above the other, each with its title right
	// above its data, and their data areas aligned left and right so that
	// one x is one latency in both (plot.Align would also make their heights
	// equal, moving the tail's title away from its data).
	panels := draw.Crop(dc, pad, -vg.Points(12), legendH, -titleH)
	gap := vg.Points(14)
	half := (panels.Size().Y - gap) / 2
	areas := []draw.Canvas{
		draw.Crop(panels, 0, 0, half+gap, 0),
		draw.Crop(panels, 0, 0, 0, -(half + gap)),
	}
	alignX([]*plot.Plot{body, tail}, areas)
	body.Draw(areas[0])
	tail.Draw(areas[1])
	_, err = c.WriteTo(w)
	return err
}

// alignX narrows the canvases cs of plots ps (one each) so that their
// data areas share their left and right edges: the widest axis labels of
// all decide.
func alignX(ps []*plot.Plot, cs []draw.Canvas) {
	var left, right vg.Length
	for i, p := range ps {
		d := p.DataCanvas(cs[i])
		left = max(left, d.Min.X-cs[i].Min.X)
		right = max(right, cs[i].Max.X-d.Max.X)
	}
	for i, p := range ps {
		d := p.DataCanvas(cs[i])
		cs[i] = draw.Crop(cs[i], left-(d.Min.X-cs[i].Min.X), -(right - (cs[i].Max.X - d.Max.X)), 0, 0)
	}
}

// addLine adds the i-th case's line to p.
func addLine(p *plot.Plot, i int, xy plotter.XYs) *plotter.Line {
	l := &plotter.Line{XYs: xy, LineStyle: plotter.DefaultLineStyle}
	l.Color = plotutil.Color(i)
	l.Dashes = plotutil.Dashes(i)
	l.Width = vg.Points(1.5)
	p.Add(l)
	return l
}

// cdf is the empirical distribution of sorted latencies in milliseconds
// (the share that took at most x), thinned to about cdfPoints points.
func cdf(sorted []time.Duration) plotter.XYs {
	n := float64(len(sorted))
	return thin(sorted, func(i int) float64 { return float64(i+1) / n })
}

// ccdf is the share of sorted latencies that took at least x: 1 at the
// fastest, 1/n at the slowest.
func ccdf(sorted []time.Duration) plotter.XYs {
	n := float64(len(sorted))
	return thin(sorted, func(i int) float64 { return (n - float64(i)) / n })
}

// thin is (sorted[i] in ms, y(i)) at about cdfPoints evenly spaced ranks,
// and at ranks closer and closer to the slowest (n-2, n-3, n-5, ... on a
// geometric scale) so that the tail keeps its shape; the first and the
// last always kept.
func thin(sorted []time.Duration, y func(i int) float64) plotter.XYs {
	n := len(sorted)
	step := max(1, n/cdfPoints)
	idx := []int{n - 1}
	for i := 0; i < n; i += step {
		idx = append(idx, i)
	}
	for k := 1.0; k < float64(n); k = math.Max(k+1, k*1.05) {
		idx = append(idx, n-1-int(k))
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	xy := make(plotter.XYs, len(idx))
	for j, i := range idx {
		xy[j] = plotter.XY{X: ms(sorted[i]), Y: y(i)}
	}
	return xy
}

// ms is d in milliseconds; a log scale has no zero, so a latency below the
// clock's resolution counts as 1ns.
func ms(d time.Duration) float64 {
	return math.Max(float64(d), 1) / float64(time.Millisecond)
}

// msTicks marks a log axis of milliseconds at 1, 2 and 5 of each decade,
// labelled, with unlabelled minor ticks between.
type msTicks struct{}

func (msTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= 0 || lo > hi {
		return nil
	}
	var ticks []plot.Tick
	for dec := math.Pow10(int(math.Floor(math.Log10(lo)))); dec <= hi*10; dec *= 10 {
		for m := 1; m < 10; m++ {
			v := dec * float64(m)
			if v < lo*0.999 || v > hi*1.001 {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// plotFormat is the image format --plot's file name asks for.
func plotFormat(name string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(name)); ext {
	case ".png", ".svg":
		return ext[1:], nil
	default:
		return "", fmt.Errorf("--plot %q: want a file name ending in .png or .svg", name)
	}
}
