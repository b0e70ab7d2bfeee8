package pgrace

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestLost(t *testing.T) {
	for code, want := range map[string]bool{"23505": true, "42P07": true, "42710": true, "42601": false, "40001": false} {
		err := fmt.Errorf("creating: %w", &pgconn.PgError{Code: code})
		if got := Lost(err); got != want {
			t.Errorf("Lost(%s) = %t, want %t", code, got, want)
		}
	}
	if Lost(errors.New("duplicate key")) {
		t.Error("Lost of an error that is no PgError = true")
	}
}
