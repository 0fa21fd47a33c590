package invoice

import (
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"time"

	"github.com/metergate/metergate/internal/document"
)

// DefaultNumberPrefix starts every document number unless configured otherwise:
// MG-2026-000123, MG-CN-2026-000004.
const DefaultNumberPrefix = "MG"

// DefaultPaymentTerms is how long after its issue an invoice is due, unless configured.
const DefaultPaymentTerms = 30 * 24 * time.Hour

// MaxTaxRateBP is the largest tax rate, in basis points: 100 %.
const MaxTaxRateBP = 10000

// Issuer is who issues the documents: the seller's details printed on them, the prefix of
// their numbers (one gapless sequence per prefix, kind and year), and the tax rates.
type Issuer struct {
	// Prefix names the issuer's sequences: 1 to 10 of A-Z and 0-9 (empty: DefaultNumberPrefix).
	Prefix string
	Seller document.Party
	// TaxRateBP is the tax rate of a customer without one of its own or of its country, in
	// basis points (1900 = 19 %); CountryTaxBP maps an ISO 3166-1 alpha-2 country to its rate.
	TaxRateBP    int
	CountryTaxBP map[string]int
	// PaymentTerms is how long after its issue an invoice is due (zero: DefaultPaymentTerms).
	PaymentTerms time.Duration
	// Source is the CloudEvents source of the billing events (empty: "metergate").
	Source string
}

var prefixRE = regexp.MustCompile(`^[A-Z0-9]{1,10}$`)

// Validate reports what is wrong with the issuer's configuration.
func (is Issuer) Validate() error {
	var errs []error
	if is.Prefix != "" && !prefixRE.MatchString(is.Prefix) {
		errs = append(errs, fmt.Errorf("number prefix %q: want 1 to 10 of A-Z and 0-9", is.Prefix))
	}
	if err := checkRate(is.TaxRateBP); err != nil {
		errs = append(errs, err)
	}
	for c, bp := range is.CountryTaxBP {
		if !countryRE.MatchString(c) {
			errs = append(errs, fmt.Errorf("tax rate of country %q: want an ISO 3166-1 alpha-2 code", c))
		}
		if err := checkRate(bp); err != nil {
			errs = append(errs, fmt.Errorf("country %s: %w", c, err))
		}
	}
	if is.PaymentTerms < 0 {
		errs = append(errs, fmt.Errorf("payment terms %s: negative", is.PaymentTerms))
	}
	return errors.Join(errs...)
}

func (is Issuer) prefix() string {
	if is.Prefix == "" {
		return DefaultNumberPrefix
	}
	return is.Prefix
}

func (is Issuer) terms() time.Duration {
	if is.PaymentTerms == 0 {
		return DefaultPaymentTerms
	}
	return is.PaymentTerms
}

func (is Issuer) source() string {
	if is.Source == "" {
		return "metergate"
	}
	return is.Source
}

// taxRate is the rate a customer's invoice is taxed at: its own, else its country's, else
// the issuer's default. d is nil for a customer without billing details.
func (is Issuer) taxRate(d *BillingDetails) int {
	if d == nil {
		return is.TaxRateBP
	}
	if d.TaxRateBP != nil {
		return *d.TaxRateBP
	}
	if bp, ok := is.CountryTaxBP[d.Country]; ok {
		return bp
	}
	return is.TaxRateBP
}

func checkRate(bp int) error {
	if bp < 0 || bp > MaxTaxRateBP {
		return fmt.Errorf("tax rate %d basis points: want 0 to %d", bp, MaxTaxRateBP)
	}
	return nil
}

// Tax is the rounding rule of tax: subtotal × rateBP / 10000, rounded half away from zero,
// computed exactly (tax_minor in SQL is the same rule).
func Tax(subtotal int64, rateBP int) (int64, error) {
	if err := checkRate(rateBP); err != nil {
		return 0, err
	}
	n := new(big.Int).Mul(big.NewInt(subtotal), big.NewInt(int64(rateBP)))
	neg := n.Sign() < 0
	n.Abs(n)
	n.Add(n, big.NewInt(5000))
	n.Quo(n, big.NewInt(10000))
	if neg {
		n.Neg(n)
	}
	if !n.IsInt64() {
		return 0, ErrOverflow
	}
	return n.Int64(), nil
}
