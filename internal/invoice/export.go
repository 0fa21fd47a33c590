package invoice

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
)

// Export writes the org's invoice of a period (its latest: a reissue's, when one was voided and reissued) as "csv" (a header, then one row per line,
// the invoice's fields repeated on each) or "json" (the Invoice with its lines).
func Export(ctx context.Context, pool *pgxpool.Pool, month time.Time, org, format string, w io.Writer) error {
	if format != "csv" && format != "json" {
		return fmt.Errorf("export format %q: want csv or json", format)
	}
	var id int64
	err := pool.QueryRow(ctx, `select id from invoices where org = $1 and period = $2 order by id desc limit 1`,
		org, period.MonthStart(month)).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("invoice of org %s for %s: %w", org, period.MonthLabel(month), ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("find the invoice of org %s for %s: %w", org, period.MonthLabel(month), err)
	}
	inv, err := Get(ctx, pool, id)
	if err != nil {
		return err
	}
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(inv); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
		return nil
	}
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"invoice_id", "org", "period", "currency", "total_minor", "line_no", "kind", "account_path",
		"unit", "quantity", "unit_price_minor", "per_units", "amount_minor", "for_period"})
	for i, l := range inv.Lines {
		_ = cw.Write([]string{strconv.FormatInt(inv.ID, 10), inv.Org, inv.Period, inv.Currency, strconv.FormatInt(inv.TotalMinor, 10),
			strconv.Itoa(i + 1), l.Kind, l.AccountPath, l.Unit, strconv.FormatInt(l.Quantity, 10),
			strconv.FormatInt(l.UnitPriceMinor, 10), strconv.FormatInt(l.PerUnits, 10), strconv.FormatInt(l.AmountMinor, 10), l.ForPeriod})
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}
