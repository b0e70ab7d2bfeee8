package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-locker/locker"
)

// service charges orders.
type service struct {
	locks    locker.Locker
	db       *sql.DB
	provider *provider
	ttl      time.Duration // lease of a payment lock
}

const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id     TEXT PRIMARY KEY,
	amount INTEGER NOT NULL,
	status TEXT NOT NULL DEFAULT 'open',
	fence  INTEGER NOT NULL DEFAULT 0  -- the highest fencing token that wrote this row
);
CREATE TABLE IF NOT EXISTS charges (
	order_id        TEXT NOT NULL UNIQUE REFERENCES orders(id),
	idempotency_key TEXT NOT NULL UNIQUE,
	provider_id     TEXT NOT NULL,
	amount          INTEGER NOT NULL,
	token           INTEGER NOT NULL
);`

func newService(ctx context.Context, locks locker.Locker, db *sql.DB, p *provider) (*service, error) {
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("creating the schema: %w", err)
	}
	return &service{locks: locks, db: db, provider: p, ttl: 10 * time.Second}, nil
}

// addOrder creates an open order (the shop would do this at checkout).
func (s *service) addOrder(ctx context.Context, id string, amount int64) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?) ON CONFLICT (id) DO NOTHING`, id, amount)
	return err
}

func (s *service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/pay", s.handlePay)
	mux.HandleFunc("PUT /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.addOrder(r.Context(), r.PathValue("id"), 1000); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

var (
	errNoOrder     = errors.New("no such order")
	errAlreadyPaid = errors.New("order already paid")
	// errStale: a newer lock holder has written the order; this holder's
	// lock is gone, whether it knows yet or not.
	errStale = errors.New("stale lock holder: a newer payment attempt owns this order")
)

func (s *service) handlePay(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var token int64
	err := locker.TryDo(r.Context(), s.locks, "payment/"+id, func(ctx context.Context, h locker.Handle) error {
		token = h.Token()
		return s.pay(ctx, id, h.Token())
	}, locker.WithTTL(s.ttl))
	switch {
	case err == nil:
		reply(w, http.StatusCreated, map[string]any{"status": "paid", "token": token})
	case errors.Is(err, locker.ErrNotAcquired):
		reply(w, http.StatusConflict, map[string]any{"status": "payment in progress"})
	case errors.Is(err, errAlreadyPaid):
		reply(w, http.StatusOK, map[string]any{"status": "already paid"})
	case errors.Is(err, errNoOrder):
		reply(w, http.StatusNotFound, map[string]any{"status": "no such order"})
	case errors.Is(err, errStale), errors.Is(err, locker.ErrLost):
		reply(w, http.StatusConflict, map[string]any{"status": "superseded by a newer attempt"})
	default:
		reply(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
	}
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// pay charges order id while holding its lock with the given fencing token.
// Every write to the order is fenced: it happens only if no newer token has
// written the order (fence <= token), and raises the fence to this token.
func (s *service) pay(ctx context.Context, id string, token int64) error {
	amount, err := s.payable(ctx, id)
	if err != nil {
		return err
	}
	return s.charge(ctx, id, amount, token)
}

// payable returns the amount of order id if it is still to be paid.
func (s *service) payable(ctx context.Context, id string) (int64, error) {
	var amount int64
	var status string
	err := s.db.QueryRowContext(ctx, `SELECT amount, status FROM orders WHERE id = ?`, id).Scan(&amount, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, errNoOrder
	case err != nil:
		return 0, err
	case status == "paid":
		return 0, errAlreadyPaid
	}
	return amount, nil
}

// charge charges amount for order id and records it, with fenced writes.
func (s *service) charge(ctx context.Context, id string, amount, token int64) error {
	// Claim the order for this token before charging: a stale holder stops
	// here once a newer one has claimed it.
	if err := s.fenced(ctx, s.db, `UPDATE orders SET status = 'charging', fence = ? WHERE id = ? AND fence <= ?`, token, id, token); err != nil {
		return err
	}
	key := "order-" + id // the same on every attempt: the provider charges a key once
	providerID, err := s.provider.charge(ctx, key, amount)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.fenced(ctx, tx, `UPDATE orders SET status = 'paid', fence = ? WHERE id = ? AND fence <= ?`, token, id, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO charges (order_id, idempotency_key, provider_id, amount, token) VALUES (?, ?, ?, ?, ?)`,
		id, key, providerID, amount, token); err != nil {
		return fmt.Errorf("recording the charge: %w", err)
	}
	return tx.Commit()
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// fenced runs a fenced UPDATE; no row changed means a newer token wrote.
func (s *service) fenced(ctx context.Context, db execer, q string, args ...any) error {
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return errStale
	}
	return nil
}

// provider stands in for a payment provider that honours idempotency keys
// (as Stripe's API does): a key is charged once, and repeating it returns the
// first charge.
type provider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	calls   int
}

func newProvider() *provider { return &provider{charges: map[string]string{}} }

func (p *provider) charge(_ context.Context, key string, amount int64) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if id, ok := p.charges[key]; ok {
		return id, nil
	}
	id := fmt.Sprintf("ch_%d_%d", len(p.charges)+1, amount)
	p.charges[key] = id
	return id, nil
}

// charged is how many distinct charges the provider made.
func (p *provider) charged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
