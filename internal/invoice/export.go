package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/period"
)

// Formats are the formats Export writes.
var Formats = []string{"json", "csv", "pdf", "html"}

// Export writes the org's invoice of a period (its latest: a reissue's, when one was
// voided and reissued) as "json" (the Invoice with its lines), or rendered from the same
// Invoice (Document) as "csv", "pdf" or "html".
func Export(ctx context.Context, pool *pgxpool.Pool, month time.Time, org, format string, w io.Writer) error {
	render := map[string]func(io.Writer, document.Document) error{"csv": document.CSV, "pdf": document.PDF, "html": document.HTML}
	if _, ok := render[format]; !ok && format != "json" {
		return fmt.Errorf("export format %q: want json, csv, pdf or html", format)
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
	replaces, err := ReplacedNumber(ctx, pool, inv)
	if err != nil {
		return err
	}
	return render[format](w, inv.Document(replaces))
}

// ReplacedNumber is the number of the invoice inv replaces: "" unless inv is a reissue.
func ReplacedNumber(ctx context.Context, q querier, inv Invoice) (string, error) {
	if inv.Replaces == nil {
		return "", nil
	}
	orig, err := readInvoices(ctx, q, []int64{*inv.Replaces}, false)
	if err != nil || len(orig) == 0 {
		return "", fmt.Errorf("the invoice %d replaces: %w", inv.ID, errors.Join(err, ErrNotFound))
	}
	return orig[0].Number, nil
}
