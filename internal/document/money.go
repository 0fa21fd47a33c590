package document

import (
	"strconv"
	"strings"
)

// exponents are the ISO 4217 minor-unit exponents that are not 2, the exponent of every
// other currency (and of one metergate does not know).
var exponents = map[string]int{
	"BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
	"RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
	"BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
	"CLF": 4, "UYW": 4,
}

// Exponent is the number of decimal places of currency's minor unit (ISO 4217): 2 for
// EUR, 0 for JPY, 3 for KWD; 2 for a currency it does not know.
func Exponent(currency string) int {
	if e, ok := exponents[strings.ToUpper(currency)]; ok {
		return e
	}
	return 2
}

// FormatMinor formats amount minor units of currency for people: "EUR 2,028.05",
// "EUR -12.50", "JPY 1,234", "KWD 1.500". It computes with integers only.
func FormatMinor(amount int64, currency string) string {
	e := Exponent(currency)
	scale := uint64(1)
	for range e {
		scale *= 10
	}
	abs := magnitude(amount)
	s := group(abs / scale)
	if e > 0 {
		frac := strconv.FormatUint(abs%scale, 10)
		s += "." + strings.Repeat("0", e-len(frac)) + frac
	}
	if amount < 0 {
		s = "-" + s
	}
	if currency == "" {
		return s
	}
	return currency + " " + s
}

// FormatQuantity formats a number of units with thousands separators: "1,250,000".
func FormatQuantity(n int64) string {
	if n < 0 {
		return "-" + group(magnitude(n))
	}
	return group(uint64(n))
}

// FormatRate formats a rate in basis points as a percentage: 1900 is "19.00 %".
func FormatRate(bp int) string {
	abs := magnitude(int64(bp))
	s := strconv.FormatUint(abs/100, 10) + "." + strconv.FormatUint(abs%100/10, 10) + strconv.FormatUint(abs%10, 10) + " %"
	if bp < 0 {
		return "-" + s
	}
	return s
}

// magnitude is |n|, also for math.MinInt64, whose magnitude an int64 cannot hold.
func magnitude(n int64) uint64 {
	if n < 0 {
		return uint64(-(n + 1)) + 1 //nolint:gosec // -(n+1) is in [0, MaxInt64]
	}
	return uint64(n)
}

// group writes n in decimal with a comma between groups of three digits.
func group(n uint64) string {
	digits := strconv.FormatUint(n, 10)
	var b strings.Builder
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
