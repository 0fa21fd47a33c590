package document

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
)

// csvHeader names the columns of CSV: the document's, then the line's.
var csvHeader = []string{
	"number", "document_kind", "org", "period", "currency",
	"line_no", "kind", "account_path", "unit", "quantity", "unit_price_minor", "per_units", "amount_minor", "for_period",
	"description",
}

// CSV writes d's lines as CSV for machines: a header, then one row per line (numbered from
// 1) with the document's number, kind, org, period and currency repeated, amounts in
// integer minor units and Describe's description. No summary rows: the totals are in the
// JSON. A text field that a spreadsheet would run as a formula is prefixed with "'".
func CSV(w io.Writer, d Document) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("write CSV of %s: %w", d.Title(), err)
	}
	for i, l := range d.Lines {
		row := []string{
			defuse(d.Number), defuse(string(d.Kind)), defuse(d.Org), defuse(d.Period), defuse(d.Currency),
			strconv.Itoa(i + 1), defuse(l.Kind), defuse(l.AccountPath), defuse(l.Unit),
			strconv.FormatInt(l.Quantity, 10), strconv.FormatInt(l.UnitPriceMinor, 10),
			strconv.FormatInt(l.PerUnits, 10), strconv.FormatInt(l.AmountMinor, 10), defuse(l.ForPeriod),
			defuse(Describe(l, d.Currency).Description),
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("write CSV of %s: %w", d.Title(), err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write CSV of %s: %w", d.Title(), err)
	}
	return nil
}

// defuse guards a text field against CSV formula injection (OWASP): a field starting with
// = + - @ tab or carriage return gets a leading apostrophe, so a spreadsheet shows it
// instead of evaluating it. Numbers are written as they are: -120 is a number.
func defuse(s string) string {
	if s != "" && (s[0] == '=' || s[0] == '+' || s[0] == '-' || s[0] == '@' || s[0] == '\t' || s[0] == '\r') {
		return "'" + s
	}
	return s
}
