package config

import (
	"errors"
	"time"

	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/reconcile"
)

// Reconcile is the configuration of cmd/reconcile, a run-once job.
type Reconcile struct {
	Log      Log
	Redis    Redis
	Postgres Postgres
	// Keyspace names the quota counters: admit's (the same variables, ADMIT_KEY_PREFIX
	// and ADMIT_SHARDS).
	Keyspace
	// Billing is who issues the invoices a close issues.
	Billing Billing
	Migrate bool
	// DryRun (-dry-run) prints the plan and changes nothing; JSON (-json) prints the summary
	// as one JSON object. Flags only: they describe one invocation, not a deployment.
	DryRun bool
	JSON   bool
	// Period (-period YYYY-MM), Force (-force), Grace (-grace), Org (-org) and Format
	// (-format json|csv|pdf|html) are the flags of `reconcile close` and `reconcile invoice`.
	Period string
	Force  bool
	Grace  time.Duration
	Org    string
	Format string
}

// Register adds every setting of reconcile to l.
func (c *Reconcile) Register(l *Loader) {
	c.Log.Register(l)
	c.Redis.Register(l)
	c.Postgres.Register(l)
	c.registerKeyspace(l)
	c.Billing.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
	l.fs.BoolVar(&c.DryRun, "dry-run", false, "print the corrections a run would make and change nothing")
	l.fs.BoolVar(&c.JSON, "json", false, "print the run's summary (or verify's differences) as one JSON object")
	l.fs.StringVar(&c.Period, "period", "", "close, invoice: the billing period, YYYY-MM (close: default the last month whose end plus the grace has passed)")
	l.fs.BoolVar(&c.Force, "force", false, "close: close before the period's end plus the grace")
	l.fs.DurationVar(&c.Grace, "grace", invoice.DefaultGrace, "close: how long after the period's end late events are still awaited")
	l.fs.StringVar(&c.Org, "org", "", "invoice: the org whose invoice to export")
	l.fs.StringVar(&c.Format, "format", "json", "invoice: json, csv, pdf or html")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Reconcile) Validate() error {
	return errors.Join(c.Log.Validate(), c.Redis.Validate(), c.Postgres.Validate(), prefix("reconcile", c.validateKeyspace()), c.Billing.Validate())
}

// ReconcileOptions returns o, which carries a run's dependencies (PostgreSQL, Redis, the
// policies, the logger), with the counters' keys and -dry-run.
func (c Reconcile) ReconcileOptions(o reconcile.Options) reconcile.Options {
	o.Keys, o.DryRun = c.Keys(), c.DryRun
	return o
}

// InvoiceOptions returns o, which carries the logger and who closes, with -force, -grace
// and the issuer (BILLING_*; its billing events' source is invoice's default).
func (c Reconcile) InvoiceOptions(o invoice.Options) invoice.Options {
	o.Force, o.Grace, o.Issuer = c.Force, c.Grace, c.Billing.Issuer()
	return o
}
