package config_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
)

// The BILLING_* settings become the issuer of admit's invoices API and reconcile's close;
// admit's node name is the source of its billing events.
func TestBillingIssuer(t *testing.T) {
	env := envMap(map[string]string{
		"BILLING_NUMBER_PREFIX": "ACME", "BILLING_SELLER_NAME": "Metergate GmbH",
		"BILLING_SELLER_ADDRESS": " Hauptstraße 1 | 3. OG ||", "BILLING_SELLER_CITY": "Berlin",
		"BILLING_SELLER_POSTAL_CODE": "10115", "BILLING_SELLER_REGION": "BE", "BILLING_SELLER_COUNTRY": "DE",
		"BILLING_SELLER_EMAIL": "billing@metergate.example", "BILLING_SELLER_TAX_ID": "DE123456789",
		"BILLING_TAX_RATE": "1900", "BILLING_TAX_RATES": "FR:2000, AT:2000", "BILLING_PAYMENT_TERMS": "336h",
		"ADMIT_NODE": "admit-7",
	})
	want := invoice.Issuer{Prefix: "ACME", Seller: document.Party{LegalName: "Metergate GmbH",
		Address: []string{"Hauptstraße 1", "3. OG"}, City: "Berlin", PostalCode: "10115", Region: "BE", Country: "DE",
		Email: "billing@metergate.example", TaxID: "DE123456789"},
		TaxRateBP: 1900, CountryTaxBP: map[string]int{"FR": 2000, "AT": 2000}, PaymentTerms: 14 * 24 * time.Hour}

	var a config.Admit
	_, err := config.Load(&a, "admit", nil, env, io.Discard)
	require.NoError(t, err)
	withSource := want
	withSource.Source = "admit-7"
	require.Equal(t, withSource, a.Issuer())

	var r config.Reconcile
	_, err = config.Load(&r, "reconcile", nil, env, io.Discard)
	require.NoError(t, err)
	require.Equal(t, want, r.InvoiceOptions(invoice.Options{}).Issuer)
}

// Without BILLING_* the issuer is invoice's defaults.
func TestBillingDefaults(t *testing.T) {
	var r config.Reconcile
	_, err := config.Load(&r, "reconcile", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	is := r.InvoiceOptions(invoice.Options{}).Issuer
	require.Equal(t, invoice.Issuer{Prefix: invoice.DefaultNumberPrefix, PaymentTerms: invoice.DefaultPaymentTerms}, is)
}

func TestBillingBadSettingsAreNamed(t *testing.T) {
	for name, tt := range map[string]struct {
		env  map[string]string
		want []string
	}{
		"prefix":         {map[string]string{"BILLING_NUMBER_PREFIX": "mg-"}, []string{`billing: BILLING_NUMBER_PREFIX="mg-"`}},
		"tax rate":       {map[string]string{"BILLING_TAX_RATE": "10001"}, []string{"billing: BILLING_TAX_RATE=10001"}},
		"tax rate text":  {map[string]string{"BILLING_TAX_RATE": "19%"}, []string{`BILLING_TAX_RATE="19%": not an integer`}},
		"country rates":  {map[string]string{"BILLING_TAX_RATES": "DE:1900,FR,de:700,IT:-1,DE:700"}, []string{`"FR" is not COUNTRY:basis points`, `country "de"`, "country IT", "DE given twice"}},
		"payment terms":  {map[string]string{"BILLING_PAYMENT_TERMS": "0s"}, []string{"billing: BILLING_PAYMENT_TERMS=0s: want more than 0"}},
		"seller country": {map[string]string{"BILLING_SELLER_NAME": "X", "BILLING_SELLER_COUNTRY": "Germany"}, []string{"billing: BILLING_SELLER_*", "country"}},
		"seller name":    {map[string]string{"BILLING_SELLER_COUNTRY": "DE"}, []string{"billing: BILLING_SELLER_*", "legal_name is required"}},
		"seller email":   {map[string]string{"BILLING_SELLER_NAME": "X", "BILLING_SELLER_COUNTRY": "DE", "BILLING_SELLER_EMAIL": "nobody"}, []string{"email"}},
	} {
		t.Run(name, func(t *testing.T) {
			for _, cfg := range []config.Config{&config.Admit{}, &config.Reconcile{}} {
				_, err := config.Load(cfg, "x", nil, envMap(tt.env), io.Discard)
				require.Error(t, err)
				for _, w := range tt.want {
					require.Contains(t, err.Error(), w)
				}
			}
		})
	}
}
