package invoice

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
)

//go:embed sql/tieout.sql
var tieoutSQL string

// TieOutDifference is one failed check of the finance_invoice_tieout view: an issued
// invoice whose total, lines and the priced usage it covers do not agree.
type TieOutDifference struct {
	InvoiceID int64     `json:"invoice_id"`
	Org       string    `json:"org"`
	Period    time.Time `json:"period"`
	Check     string    `json:"check"`
	Unit      *string   `json:"unit,omitempty"`
	Expected  string    `json:"expected"`
	Actual    string    `json:"actual"`
}

func (d TieOutDifference) String() string {
	unit := ""
	if d.Unit != nil {
		unit = " " + *d.Unit
	}
	return fmt.Sprintf("invoice %d (%s %s)%s: %s: expected %s, actual %s",
		d.InvoiceID, d.Org, period.MonthLabel(d.Period), unit, d.Check, d.Expected, d.Actual)
}

// TieOut returns every difference the finance_invoice_tieout view lists: none when every
// invoice ties out.
func TieOut(ctx context.Context, pool *pgxpool.Pool) ([]TieOutDifference, error) {
	rows, err := pool.Query(ctx, tieoutSQL)
	if err != nil {
		return nil, fmt.Errorf("read the invoice tie-out: %w", err)
	}
	diffs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TieOutDifference, error) {
		var d TieOutDifference
		return d, r.Scan(&d.InvoiceID, &d.Org, &d.Period, &d.Check, &d.Unit, &d.Expected, &d.Actual)
	})
	if err != nil {
		return nil, fmt.Errorf("read the invoice tie-out: %w", err)
	}
	return diffs, nil
}
