package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
)

// closePeriod freezes a period and issues its invoices, printing the result; without
// -period, the last month whose end plus the grace has passed (what a monthly CronJob closes).
// When some orgs' invoices could not be issued it prints the result (their errors in
// "Failed"), the others being issued, and fails; the same command again retries them.
func closePeriod(ctx context.Context, e env) error {
	month := invoice.LastClosable(time.Now(), e.cfg.Grace)
	if e.cfg.Period != "" {
		p, err := period.ParseMonth(e.cfg.Period)
		if err != nil {
			return fmt.Errorf("-period: %w", err)
		}
		month = p
	}
	res, err := invoice.Close(ctx, e.pool, month, e.cfg.InvoiceOptions(invoice.Options{By: "reconcile close", Log: e.log}))
	if err != nil && !errors.Is(err, invoice.ErrInvoicesFailed) {
		return err
	}
	if err := json.NewEncoder(e.out).Encode(res); err != nil {
		return fmt.Errorf("print the close: %w", err)
	}
	e.log.Info("period closed", "period", period.MonthLabel(month), "created", res.Created, "issued", res.Issued,
		"failed", len(res.Failed))
	return err
}

// printInvoice prints the issued invoice of -org for -period.
func printInvoice(ctx context.Context, e env) error {
	month, err := period.ParseMonth(e.cfg.Period)
	if err != nil {
		return fmt.Errorf("-period: %w", err)
	}
	if e.cfg.Org == "" {
		return errors.New("-org: the org whose invoice to print is required")
	}
	return invoice.Export(ctx, e.pool, month, e.cfg.Org, e.cfg.Format, e.out)
}
