// Package pgrace recognises the errors PostgreSQL gives the losers of a
// race to create the same relation. CREATE ... IF NOT EXISTS is not
// atomic: two sessions may both find the name free, and the one that
// commits second fails although the relation it wanted now exists.
package pgrace

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Lost reports whether err is such a loss: a unique violation on the
// catalog (23505), the relation (42P07) or its row type (42710) already
// there. Running the statement again is then a no-op.
func Lost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "42P07" || pe.Code == "42710")
}
