// Package shop is the payment example's service (cmd: examples/payment):
// POST /orders/{id}/pay charges an order at most once, under the lock
// payment/{id}, with fenced writes and an idempotency key. It is a package
// of its own so that other examples (examples/observe-prometheus) can run
// the same service on a wrapped Locker.
package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-locker/locker"
)

// Service charges orders.
type Service struct {
	Locks    locker.Locker
	DB       *sql.DB
	Provider *Provider
	TTL      time.Duration // lease of a payment lock
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

// New returns the service on the Locker locks and the orders database db
// (see OpenDB), creating its tables, with p as the payment provider.
func New(ctx context.Context, locks locker.Locker, db *sql.DB, p *Provider) (*Service, error) {
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("creating the schema: %w", err)
	}
	return &Service{Locks: locks, DB: db, Provider: p, TTL: 10 * time.Second}, nil
}

// AddOrder creates an open order (the shop would do this at checkout).
func (s *Service) AddOrder(ctx context.Context, id string, amount int64) error {
	_, err := s.DB.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?) ON CONFLICT (id) DO NOTHING`, id, amount)
	return err
}

// Handler serves POST /orders/{id}/pay and PUT /orders/{id} (an open
// order of 1000).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/pay", s.handlePay)
	mux.HandleFunc("PUT /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.AddOrder(r.Context(), r.PathValue("id"), 1000); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// OpenDB opens the orders database: SQLite in WAL mode with a busy timeout,
// so that several instances of the service can share it.
func OpenDB(path string) (*sql.DB, error) {
	return sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
}

// The errors of Pay.
var (
	ErrNoOrder     = errors.New("no such order")
	ErrAlreadyPaid = errors.New("order already paid")
	// ErrStale: a newer lock holder has written the order; this holder's
	// lock is gone, whether it knows yet or not.
	ErrStale = errors.New("stale lock holder: a newer payment attempt owns this order")
)

func (s *Service) handlePay(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var token int64
	err := locker.TryDo(r.Context(), s.Locks, "payment/"+id, func(ctx context.Context, h locker.Handle) error {
		token = h.Token()
		return s.Pay(ctx, id, h.Token())
	}, locker.WithTTL(s.TTL))
	switch {
	case err == nil:
		reply(w, http.StatusCreated, map[string]any{"status": "paid", "token": token})
	case errors.Is(err, locker.ErrNotAcquired):
		reply(w, http.StatusConflict, map[string]any{"status": "payment in progress"})
	case errors.Is(err, ErrAlreadyPaid):
		reply(w, http.StatusOK, map[string]any{"status": "already paid"})
	case errors.Is(err, ErrNoOrder):
		reply(w, http.StatusNotFound, map[string]any{"status": "no such order"})
	case errors.Is(err, ErrStale), errors.Is(err, locker.ErrLost):
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

// Pay charges order id while holding its lock with the given fencing token.
// Every write to the order is fenced: it happens only if no newer token has
// written the order (fence <= token), and raises the fence to this token.
func (s *Service) Pay(ctx context.Context, id string, token int64) error {
	amount, err := s.Payable(ctx, id)
	if err != nil {
		return err
	}
	return s.Charge(ctx, id, amount, token)
}

// Payable returns the amount of order id if it is still to be paid.
func (s *Service) Payable(ctx context.Context, id string) (int64, error) {
	var amount int64
	var status string
	err := s.DB.QueryRowContext(ctx, `SELECT amount, status FROM orders WHERE id = ?`, id).Scan(&amount, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, ErrNoOrder
	case err != nil:
		return 0, err
	case status == "paid":
		return 0, ErrAlreadyPaid
	}
	return amount, nil
}

// Charge charges amount for order id and records it, with fenced writes.
func (s *Service) Charge(ctx context.Context, id string, amount, token int64) error {
	// Claim the order for this token before charging: a stale holder stops
	// here once a newer one has claimed it.
	if err := s.fenced(ctx, s.DB, `UPDATE orders SET status = 'charging', fence = ? WHERE id = ? AND fence <= ?`, token, id, token); err != nil {
		return err
	}
	key := "order-" + id // the same on every attempt: the provider charges a key once
	providerID, err := s.Provider.charge(ctx, key, amount)
	if err != nil {
		return err
	}
	tx, err := s.DB.BeginTx(ctx, nil)
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
func (s *Service) fenced(ctx context.Context, db execer, q string, args ...any) error {
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrStale
	}
	return nil
}

// Provider stands in for a payment provider that honours idempotency keys
// (as Stripe's API does): a key is charged once, and repeating it returns the
// first charge.
type Provider struct {
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	calls   int
}

func NewProvider() *Provider { return &Provider{charges: map[string]string{}} }

func (p *Provider) charge(_ context.Context, key string, amount int64) (string, error) {
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

// Charged is how many distinct charges the provider made.
func (p *Provider) Charged() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}
