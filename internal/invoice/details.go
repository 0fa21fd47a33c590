package invoice

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/mail"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/period"
)

// BillingDetails is who a customer's (an org's) invoices are addressed to, written through
// the admin API. An invoice copies them when it is issued: a later change moves no
// issued document.
type BillingDetails struct {
	Org string `json:"org"`
	document.Party
	// Currency is the currency the customer is invoiced in (empty: its plan's). A close
	// fails, for this org alone, when its plan is priced in another one.
	Currency string `json:"currency,omitempty"`
	// TaxRateBP is the customer's tax rate in basis points; nil: its country's, else the
	// issuer's default (Issuer).
	TaxRateBP *int      `json:"tax_rate_bp,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

var (
	// ErrInvalidDetails is returned for billing details that do not validate; the message
	// says which field and why.
	ErrInvalidDetails = errors.New("invalid billing details")
	// ErrNotOrg is returned for billing details of an account that is not an org.
	ErrNotOrg = errors.New("not an org")
	// ErrCurrencyMismatch is returned when a customer's currency is not the one its plan is
	// priced in.
	ErrCurrencyMismatch = errors.New("currency mismatch")
)

var (
	countryRE  = regexp.MustCompile(`^[A-Z]{2}$`)
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Validate reports the first field of d that does not validate, wrapping ErrInvalidDetails.
func (d BillingDetails) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidDetails, fmt.Sprintf(format, args...))
	}
	texts := []struct {
		name, value string
		max         int
	}{
		{"legal_name", d.LegalName, 200}, {"city", d.City, 100}, {"postal_code", d.PostalCode, 20},
		{"region", d.Region, 100}, {"email", d.Email, 254}, {"tax_id", d.TaxID, 50},
	}
	for i, line := range d.Address {
		texts = append(texts, struct {
			name, value string
			max         int
		}{fmt.Sprintf("address[%d]", i), line, 200})
	}
	for _, f := range texts {
		if len(f.value) > f.max {
			return bad("%s is %d bytes, more than %d", f.name, len(f.value), f.max)
		}
		if strings.ContainsFunc(f.value, unicode.IsControl) {
			return bad("%s holds a control character", f.name)
		}
	}
	switch {
	case strings.TrimSpace(d.LegalName) == "":
		return bad("legal_name is required")
	case len(d.Address) > 4:
		return bad("address has %d lines, more than 4", len(d.Address))
	case !countryRE.MatchString(d.Country):
		return bad("country %q: want an ISO 3166-1 alpha-2 code such as DE", d.Country)
	case d.Currency != "" && !currencyRE.MatchString(d.Currency):
		return bad("currency %q: want an ISO 4217 code such as EUR", d.Currency)
	case d.TaxRateBP != nil && checkRate(*d.TaxRateBP) != nil:
		return bad("tax_rate_bp %d: want 0 to %d (basis points: 1900 = 19 %%)", *d.TaxRateBP, MaxTaxRateBP)
	}
	if d.Email != "" {
		if a, err := mail.ParseAddress(d.Email); err != nil || a.Address != d.Email {
			return bad("email %q is not an address", d.Email)
		}
	}
	return nil
}

// The statements of billing details.
var (
	//go:embed sql/put_billing_details.sql
	putBillingDetailsSQL string
	//go:embed sql/billing_details.sql
	billingDetailsSQL string
	//go:embed sql/org_currency.sql
	orgCurrencySQL string
)

// PutBillingDetails writes the billing details of d.Org (replacing any), after checking
// them (ErrInvalidDetails), that the account is an org (ErrNotOrg; ErrNotFound when there
// is no such account) and that a currency given is the one the org's plan is priced in
// this month (ErrCurrencyMismatch). It returns them as stored.
func PutBillingDetails(ctx context.Context, pool *pgxpool.Pool, d BillingDetails, now time.Time) (BillingDetails, error) {
	if err := d.Validate(); err != nil {
		return BillingDetails{}, err
	}
	if d.Address == nil {
		d.Address = []string{}
	}
	var isOrg bool
	var planCurrency *string
	err := pool.QueryRow(ctx, orgCurrencySQL, pgx.StrictNamedArgs{"org": d.Org, "period": period.MonthStart(now)}).Scan(&isOrg, &planCurrency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return BillingDetails{}, fmt.Errorf("account %q: %w", d.Org, ErrNotFound)
	case err != nil:
		return BillingDetails{}, fmt.Errorf("read account %s: %w", d.Org, err)
	case !isOrg:
		return BillingDetails{}, fmt.Errorf("account %q: billing details are an org's: %w", d.Org, ErrNotOrg)
	case d.Currency != "" && planCurrency != nil && *planCurrency != d.Currency:
		return BillingDetails{}, fmt.Errorf("%w: org %s's plan is priced in %s, not %s", ErrCurrencyMismatch, d.Org, *planCurrency, d.Currency)
	}
	if err := pool.QueryRow(ctx, putBillingDetailsSQL, pgx.StrictNamedArgs{
		"org": d.Org, "legal_name": d.LegalName, "address": d.Address, "city": d.City, "postal_code": d.PostalCode,
		"region": d.Region, "country": d.Country, "email": d.Email, "tax_id": d.TaxID, "currency": orNull(d.Currency),
		"tax_rate_bp": d.TaxRateBP, "updated_by": d.UpdatedBy,
	}).Scan(&d.UpdatedAt); err != nil {
		return BillingDetails{}, fmt.Errorf("write billing details of %s: %w", d.Org, err)
	}
	return d, nil
}

// GetBillingDetails returns org's billing details; ErrNotFound when it has none.
func GetBillingDetails(ctx context.Context, q querier, org string) (BillingDetails, error) {
	all, err := readBillingDetails(ctx, q, []string{org})
	if err != nil {
		return BillingDetails{}, err
	}
	d, ok := all[org]
	if !ok {
		return BillingDetails{}, fmt.Errorf("billing details of %q: %w", org, ErrNotFound)
	}
	return *d, nil
}

// readBillingDetails maps each org of orgs that has billing details to them.
func readBillingDetails(ctx context.Context, q querier, orgs []string) (map[string]*BillingDetails, error) {
	rows, err := q.Query(ctx, billingDetailsSQL, pgx.StrictNamedArgs{"orgs": orgs})
	if err != nil {
		return nil, fmt.Errorf("read billing details: %w", err)
	}
	defer rows.Close()
	out := map[string]*BillingDetails{}
	for rows.Next() {
		var d BillingDetails
		if err := rows.Scan(&d.Org, &d.LegalName, &d.Address, &d.City, &d.PostalCode, &d.Region, &d.Country, &d.Email,
			&d.TaxID, &d.Currency, &d.TaxRateBP, &d.UpdatedAt, &d.UpdatedBy); err != nil {
			return nil, fmt.Errorf("read billing details: %w", err)
		}
		out[d.Org] = &d
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read billing details: %w", err)
	}
	return out, nil
}
