package main

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func newTestApp(t *testing.T) (*app, *httptest.Server) {
	t.Helper()
	a, err := newApp(context.Background(), t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler)
	t.Cleanup(func() { srv.Close(); a.close() })
	return a, srv
}

func call(t *testing.T, srv *httptest.Server, method, path string) int {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode
}

// scrape reads GET /metrics as Prometheus would, in the text format.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics is not the Prometheus text format: %v", err)
	}
	return fams
}

// series finds the one series of family name whose labels include want
// (label=value pairs), and fails the test if there is not exactly one.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	var found []*dto.Metric
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		// Every locker series names the backend and the family.
		if labels["locker_backend"] != "sqlite" || labels["locker_family"] != "mutex" || labels["otel_scope_name"] != "github.com/go-locker/locker/observe" {
			t.Errorf("%s series %v: want locker_backend sqlite, locker_family mutex, otel_scope_name of observe", name, labels)
		}
		ok := true
		for _, kv := range want {
			k, v, _ := strings.Cut(kv, "=")
			ok = ok && labels[k] == v
		}
		if ok {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s{%s}: %d series, want 1", name, strings.Join(want, ","), len(found))
	}
	return found[0]
}

// checkHistogram checks the series of histogram name with labels want:
// its count, its buckets (observe's bounds, cumulative, +Inf = count) and
// a positive sum.
func checkHistogram(t *testing.T, fams map[string]*dto.MetricFamily, name string, count uint64, want ...string) {
	t.Helper()
	if typ := fams[name].GetType(); typ != dto.MetricType_HISTOGRAM {
		t.Errorf("%s is a %v, want a histogram", name, typ)
	}
	h := series(t, fams, name, want...).GetHistogram()
	if h.GetSampleCount() != count {
		t.Errorf("%s_count{%s} = %d, want %d", name, strings.Join(want, ","), h.GetSampleCount(), count)
	}
	if count > 0 && h.GetSampleSum() <= 0 {
		t.Errorf("%s_sum{%s} = %v, want > 0", name, strings.Join(want, ","), h.GetSampleSum())
	}
	b := h.GetBucket()
	// observe's bounds, 100µs to an hour, and +Inf.
	if len(b) != 24 || b[0].GetUpperBound() != 0.0001 || b[22].GetUpperBound() != 3600 || !math.IsInf(b[23].GetUpperBound(), 1) {
		t.Fatalf("%s{%s}: %d buckets from %v to %v, want observe's 23 from 0.0001 to 3600 and +Inf", name, strings.Join(want, ","),
			len(b), b[0].GetUpperBound(), b[len(b)-1].GetUpperBound())
	}
	for i := 1; i < len(b); i++ {
		if b[i].GetCumulativeCount() < b[i-1].GetCumulativeCount() {
			t.Errorf("%s{%s}: buckets not cumulative at le=%v", name, strings.Join(want, ","), b[i].GetUpperBound())
		}
	}
	if inf := b[23].GetCumulativeCount(); inf != count {
		t.Errorf("%s_bucket{%s,le=\"+Inf\"} = %d, want the count %d", name, strings.Join(want, ","), inf, count)
	}
}

func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	if typ := fams[name].GetType(); typ != dto.MetricType_GAUGE {
		t.Errorf("%s is a %v, want a gauge", name, typ)
	}
	return series(t, fams, name).GetGauge().GetValue()
}

func counter(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	if typ := fams[name].GetType(); typ != dto.MetricType_COUNTER {
		t.Errorf("%s is a %v, want a counter", name, typ)
	}
	return series(t, fams, name, want...).GetCounter().GetValue()
}

// TestMetrics runs a scripted sequence on the payment service and scrapes
// /metrics: order 42 is paid, then clicked again (already paid); order 43
// is held by another holder (an Acquire through the same Locker) with a
// second Acquire waiting behind it, so its first click gets 409; the
// holder releases, the waiter takes and releases the lock, and the next
// click pays order 43. Every locker_* series must count exactly that.
func TestMetrics(t *testing.T) {
	a, srv := newTestApp(t)
	ctx := context.Background()
	for _, id := range []string{"42", "43"} {
		if code := call(t, srv, http.MethodPut, "/orders/"+id); code != http.StatusNoContent {
			t.Fatalf("PUT /orders/%s: %d", id, code)
		}
	}
	if code := call(t, srv, http.MethodPost, "/orders/42/pay"); code != http.StatusCreated {
		t.Fatalf("paying order 42: %d, want 201", code)
	}
	if code := call(t, srv, http.MethodPost, "/orders/42/pay"); code != http.StatusOK {
		t.Fatalf("paying order 42 again: %d, want 200 (already paid)", code)
	}

	holder, err := a.locks.Acquire(ctx, "payment/43")
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		h, err := a.locks.Acquire(ctx, "payment/43")
		if err == nil {
			err = h.Release(ctx)
		}
		waited <- err
	}()
	// The waiter shows in locker_waiting once it is inside Acquire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams := scrape(t, srv)
		if fams["locker_waiting"] != nil && gauge(t, fams, "locker_waiting") == 1 {
			if held := gauge(t, fams, "locker_held"); held != 1 {
				t.Errorf("locker_held = %v while order 43's lock is held, want 1", held)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("locker_waiting never showed the waiter")
		}
		time.Sleep(5 * time.Millisecond) // polling the scrape, as Prometheus would
	}
	if code := call(t, srv, http.MethodPost, "/orders/43/pay"); code != http.StatusConflict {
		t.Fatalf("paying order 43 while its lock is held: %d, want 409", code)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if code := call(t, srv, http.MethodPost, "/orders/43/pay"); code != http.StatusCreated {
		t.Fatalf("paying order 43: %d, want 201", code)
	}

	fams := scrape(t, srv)
	// TryAcquire: the three clicks that got the lock (two that paid, one
	// that found order 42 paid) and the one that got 409.
	checkHistogram(t, fams, "locker_acquire_duration_seconds", 3, "locker_operation=try_acquire", "locker_outcome=acquired")
	checkHistogram(t, fams, "locker_acquire_duration_seconds", 1, "locker_operation=try_acquire", "locker_outcome=not_acquired")
	// Acquire: the holder and the waiter; the waiter also waited.
	checkHistogram(t, fams, "locker_acquire_duration_seconds", 2, "locker_operation=acquire", "locker_outcome=acquired")
	checkHistogram(t, fams, "locker_acquire_wait_seconds", 1, "locker_outcome=acquired")
	checkHistogram(t, fams, "locker_hold_duration_seconds", 5, "locker_end=released")
	if n := len(fams["locker_acquire_duration_seconds"].GetMetric()); n != 3 {
		t.Errorf("locker_acquire_duration_seconds has %d series, want 3", n)
	}
	if v := counter(t, fams, "locker_releases_total", "locker_outcome=released"); v != 5 {
		t.Errorf("locker_releases_total{outcome=released} = %v, want 5", v)
	}
	if n := len(fams["locker_releases_total"].GetMetric()); n != 1 {
		t.Errorf("locker_releases_total has %d series, want 1 (released)", n)
	}
	if f := fams["locker_losses_total"]; f != nil {
		t.Errorf("locker_losses_total has series, but no lock was lost: %v", f)
	}
	if v := gauge(t, fams, "locker_held"); v != 0 {
		t.Errorf("locker_held = %v after every release, want 0", v)
	}
	if v := gauge(t, fams, "locker_waiting"); v != 0 {
		t.Errorf("locker_waiting = %v, want 0", v)
	}
	for name, f := range fams {
		if strings.HasPrefix(name, "locker") && !strings.Contains(f.GetHelp(), " ") {
			t.Errorf("%s has no help text: %q", name, f.GetHelp())
		}
	}
}
