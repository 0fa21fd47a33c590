package document

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFormatMinor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		amount   int64
		currency string
		want     string
	}{
		{202805, "EUR", "EUR 2,028.05"},
		{-1250, "EUR", "EUR -12.50"},
		{0, "EUR", "EUR 0.00"},
		{5, "EUR", "EUR 0.05"},
		{-5, "USD", "USD -0.05"},
		{100, "GBP", "GBP 1.00"},
		{99999, "EUR", "EUR 999.99"},
		{100000, "EUR", "EUR 1,000.00"},
		{1234, "JPY", "JPY 1,234"},
		{-1234567, "KRW", "KRW -1,234,567"},
		{0, "CLP", "CLP 0"},
		{1500, "KWD", "KWD 1.500"},
		{-7, "BHD", "BHD -0.007"},
		{1234567, "TND", "TND 1,234.567"},
		{10000, "CLF", "CLF 1.0000"},
		{1234, "XYZ", "XYZ 12.34"},
		{1234, "jpy", "jpy 1,234"},
		{1234, "", "12.34"},
		{math.MaxInt64, "EUR", "EUR 92,233,720,368,547,758.07"},
		{math.MinInt64, "EUR", "EUR -92,233,720,368,547,758.08"},
		{math.MinInt64, "JPY", "JPY -9,223,372,036,854,775,808"},
		{math.MinInt64, "KWD", "KWD -9,223,372,036,854,775.808"},
	} {
		require.Equal(t, tc.want, FormatMinor(tc.amount, tc.currency), "%d %s", tc.amount, tc.currency)
	}
}

func TestFormatQuantity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0"},
		{999, "999"},
		{1000, "1,000"},
		{100000, "100,000"},
		{1250000, "1,250,000"},
		{-300000, "-300,000"},
		{-1, "-1"},
		{math.MaxInt64, "9,223,372,036,854,775,807"},
		{math.MinInt64, "-9,223,372,036,854,775,808"},
	} {
		require.Equal(t, tc.want, FormatQuantity(tc.n), "%d", tc.n)
	}
}

func TestFormatRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		bp   int
		want string
	}{
		{1900, "19.00 %"},
		{0, "0.00 %"},
		{750, "7.50 %"},
		{5, "0.05 %"},
		{10000, "100.00 %"},
		{-250, "-2.50 %"},
	} {
		require.Equal(t, tc.want, FormatRate(tc.bp), "%d", tc.bp)
	}
}
