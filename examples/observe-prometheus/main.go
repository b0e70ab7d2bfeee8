// Command observe-prometheus is the payment example (examples/payment, its
// service in examples/payment/shop) with its locks recorded by package
// observe and served to Prometheus: the service's Locker is wrapped with
// observe.Open, whose metrics go through the OpenTelemetry SDK to the
// OpenTelemetry Prometheus exporter, and GET /metrics serves them.
//
//	go run . -addr 127.0.0.1:8080   (from examples/observe-prometheus)
//	curl -X PUT localhost:8080/orders/42
//	curl -X POST localhost:8080/orders/42/pay
//	curl localhost:8080/metrics
//
// It is a module of its own, so that the Prometheus client and the exporter
// are no dependency of the locker module: a program that imports locker
// downloads neither (integration/deps checks a consumer's go.sum).
//
// The series it serves after the payment of one order (the Prometheus names
// of observe's metrics: dots become underscores, the unit s adds _seconds,
// counters get _total; every series also carries locker_backend,
// locker_family and the otel_scope_* labels; a series appears once it has
// been recorded, so locker_waiting and locker_acquire_wait_seconds only
// after a blocking Acquire, which the service does not make):
//
//	locker_acquire_duration_seconds_bucket{locker_operation="try_acquire",locker_outcome="acquired",le="0.005"} 1
//	locker_acquire_duration_seconds_count{locker_operation="try_acquire",locker_outcome="acquired"} 1
//	locker_hold_duration_seconds_count{locker_end="released"} 1
//	locker_releases_total{locker_outcome="released"} 1
//	locker_held 0
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/examples/payment/shop"
	"github.com/go-locker/locker/observe"
	_ "github.com/go-locker/locker/postgres"
	_ "github.com/go-locker/locker/redis"
	_ "github.com/go-locker/locker/sqltable/sqlite" // sqlite: (the default here)
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	dir := flag.String("dir", ".", "directory of the SQLite files")
	lockURL := flag.String("lock-url", "", "lock backend URL (default: sqlite:DIR/locks.db)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := serve(ctx, *addr, *dir, *lockURL); err != nil {
		log.Fatal(err)
	}
}

// app is the payment service with its locks recorded.
type app struct {
	locks   locker.Locker // the service's Locker, wrapped by observe
	handler http.Handler  // the service's routes and GET /metrics
	close   func()
}

// newApp opens the locks at lockURL (default: SQLite in dir), wraps them
// with observe, and serves the payment service and the metrics.
func newApp(ctx context.Context, dir, lockURL string) (_ *app, err error) {
	if lockURL == "" {
		lockURL = "sqlite://" + filepath.Join(dir, "locks.db")
	}
	// A registry of its own rather than prometheus.DefaultRegisterer:
	// /metrics serves the locker.* series and nothing a library
	// registered by itself.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	locks, err := observe.Open(ctx, lockURL, observe.WithMeterProvider(mp))
	if err != nil {
		return nil, err
	}
	db, err := shop.OpenDB(filepath.Join(dir, "payments.db"))
	if err != nil {
		locks.Close()
		return nil, err
	}
	s, err := shop.New(ctx, locks, db, shop.NewProvider())
	if err != nil {
		locks.Close()
		db.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/orders/", s.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return &app{locks: locks, handler: mux, close: func() {
		locks.Close() // records the end of any lock still held
		db.Close()
		_ = mp.Shutdown(context.Background())
	}}, nil
}

func serve(ctx context.Context, addr, dir, lockURL string) error {
	a, err := newApp(ctx, dir, lockURL)
	if err != nil {
		return err
	}
	defer a.close()
	srv := &http.Server{Addr: addr, Handler: a.handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Printf("observe-prometheus: listening on http://%s (POST /orders/{id}/pay, GET /metrics)\n", addr)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}
