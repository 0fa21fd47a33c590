package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
)

// Billing is who issues the invoices and credit notes (admit's invoices API, reconcile's
// close): the seller printed on them, the prefix of their numbers, the tax rates and the
// payment terms (invoice.Issuer).
type Billing struct {
	NumberPrefix string
	// Seller's fields; SellerAddress holds the street lines separated by "|".
	SellerName, SellerAddress, SellerCity, SellerPostalCode string
	SellerRegion, SellerCountry, SellerEmail, SellerTaxID   string
	// TaxRateBP is the default tax rate in basis points; TaxRates the rates of countries,
	// "DE:1900", one an item.
	TaxRateBP    int
	TaxRates     []string
	PaymentTerms time.Duration
}

// Register adds the BILLING_* settings.
func (c *Billing) Register(l *Loader) {
	l.String(&c.NumberPrefix, "BILLING_NUMBER_PREFIX", invoice.DefaultNumberPrefix, "start of every document number (MG-2026-000123, MG-CN-2026-000004): 1-10 of A-Z and 0-9, one gapless sequence per prefix, kind and year")
	l.String(&c.SellerName, "BILLING_SELLER_NAME", "", "the seller's legal name, printed on every invoice and credit note")
	l.String(&c.SellerAddress, "BILLING_SELLER_ADDRESS", "", "the seller's street address, at most 4 lines separated by |")
	l.String(&c.SellerCity, "BILLING_SELLER_CITY", "", "the seller's city")
	l.String(&c.SellerPostalCode, "BILLING_SELLER_POSTAL_CODE", "", "the seller's postal code")
	l.String(&c.SellerRegion, "BILLING_SELLER_REGION", "", "the seller's region or state")
	l.String(&c.SellerCountry, "BILLING_SELLER_COUNTRY", "", "the seller's country, ISO 3166-1 alpha-2 (DE)")
	l.String(&c.SellerEmail, "BILLING_SELLER_EMAIL", "", "the seller's billing email address")
	l.String(&c.SellerTaxID, "BILLING_SELLER_TAX_ID", "", "the seller's tax id (VAT number)")
	l.Int(&c.TaxRateBP, "BILLING_TAX_RATE", 0, "tax rate in basis points (1900 = 19 %) of a customer without a rate of its own or of its country; 0-10000")
	l.List(&c.TaxRates, "BILLING_TAX_RATES", nil, "tax rates of countries in basis points, COUNTRY:BP,... (DE:1900,FR:2000)")
	l.Duration(&c.PaymentTerms, "BILLING_PAYMENT_TERMS", invoice.DefaultPaymentTerms, "how long after its issue an invoice is due")
}

// Validate reports every bad billing setting, each named by its variable: the issuer's
// own check (invoice.Issuer.Validate) of each part, and the seller's details checked as a
// customer's are (a name, a country, bounded lines, an email that is an address) once any
// of them is set.
func (c Billing) Validate() error {
	is, errs := c.issuer()
	for _, part := range []struct {
		name   string
		issuer invoice.Issuer
	}{
		{fmt.Sprintf("BILLING_NUMBER_PREFIX=%q", c.NumberPrefix), invoice.Issuer{Prefix: is.Prefix}},
		{fmt.Sprintf("BILLING_TAX_RATE=%d", c.TaxRateBP), invoice.Issuer{TaxRateBP: is.TaxRateBP}},
		{"BILLING_TAX_RATES", invoice.Issuer{CountryTaxBP: is.CountryTaxBP}},
	} {
		if err := part.issuer.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", part.name, err))
		}
	}
	if c.PaymentTerms <= 0 {
		errs = append(errs, fmt.Errorf("BILLING_PAYMENT_TERMS=%s: want more than 0", c.PaymentTerms))
	}
	if c.SellerName+c.SellerAddress+c.SellerCity+c.SellerPostalCode+c.SellerRegion+c.SellerCountry+c.SellerEmail+c.SellerTaxID != "" {
		if err := (invoice.BillingDetails{Party: is.Seller}).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("BILLING_SELLER_*: %w", err))
		}
	}
	return prefix("billing", errs)
}

// Issuer is the issuer the settings describe. Call it after Validate; its Source is left
// empty for the binary to set.
func (c Billing) Issuer() invoice.Issuer {
	is, _ := c.issuer()
	return is
}

// issuer builds the issuer and returns the settings it could not parse.
func (c Billing) issuer() (invoice.Issuer, []error) {
	var errs []error
	is := invoice.Issuer{
		Prefix: c.NumberPrefix,
		Seller: document.Party{LegalName: c.SellerName, City: c.SellerCity, PostalCode: c.SellerPostalCode,
			Region: c.SellerRegion, Country: c.SellerCountry, Email: c.SellerEmail, TaxID: c.SellerTaxID},
		TaxRateBP:    c.TaxRateBP,
		PaymentTerms: c.PaymentTerms,
	}
	for _, line := range strings.Split(c.SellerAddress, "|") {
		if line = strings.TrimSpace(line); line != "" {
			is.Seller.Address = append(is.Seller.Address, line)
		}
	}
	for _, item := range c.TaxRates {
		country, bp, ok := strings.Cut(item, ":")
		n, err := strconv.Atoi(strings.TrimSpace(bp))
		country = strings.TrimSpace(country)
		if !ok || err != nil || country == "" {
			errs = append(errs, fmt.Errorf("BILLING_TAX_RATES: %q is not COUNTRY:basis points (DE:1900)", item))
			continue
		}
		if _, dup := is.CountryTaxBP[country]; dup {
			errs = append(errs, fmt.Errorf("BILLING_TAX_RATES: %s given twice", country))
			continue
		}
		if is.CountryTaxBP == nil {
			is.CountryTaxBP = map[string]int{}
		}
		is.CountryTaxBP[country] = n
	}
	return is, errs
}
