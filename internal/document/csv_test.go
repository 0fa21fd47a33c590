package document

import (
	"bytes"
	"encoding/csv"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func readCSV(t *testing.T, d Document) [][]string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, CSV(&b, d))
	records, err := csv.NewReader(&b).ReadAll()
	require.NoError(t, err)
	return records
}

func TestCSV(t *testing.T) {
	t.Parallel()
	d := fixture()
	records := readCSV(t, d)
	require.Equal(t, csvHeader, records[0])
	require.Len(t, records, 1+len(d.Lines), "a header and one row per line, no summary")
	require.Equal(t, []string{
		"MG-2026-000123", "invoice", "acme", "2026-10", "EUR",
		"12", "adjustment", "acme", "requests", "-300000", "0", "1", "-120", "2026-08-01",
		"Correction of requests for 2026-08",
	}, records[12])
	require.Equal(t, "requests at EUR 0.50 per 100,000", records[6][14])

	var sum int64
	for i, r := range records[1:] {
		require.Equal(t, strconv.Itoa(i+1), r[5])
		amount, err := strconv.ParseInt(r[12], 10, 64)
		require.NoError(t, err)
		sum += amount
	}
	require.Equal(t, d.SubtotalMinor, sum)
}

func TestCSVDefusesFormulas(t *testing.T) {
	t.Parallel()
	d := fixture()
	d.Org = "=HYPERLINK(\"http://evil.example\",\"x\")"
	d.Lines = []Line{
		{Kind: "usage", AccountPath: "+cmd|' /C calc'!A0", Unit: "requests", Quantity: 1, PerUnits: 1},
		{Kind: "usage", AccountPath: "@SUM(1+1)", Unit: "-2+3", Quantity: 1, PerUnits: 1},
		{Kind: "usage", AccountPath: "\tx", Unit: "\rx", Quantity: 1, PerUnits: 1},
		{Kind: "adjustment", AccountPath: "acme", Unit: "=1+1", Quantity: -5, PerUnits: 1, AmountMinor: -7},
		{Kind: "included", AccountPath: "acme", Unit: "=1+1", Quantity: 1, PerUnits: 1},
	}
	records := readCSV(t, d)
	require.Equal(t, `'=HYPERLINK("http://evil.example","x")`, records[1][2])
	require.Equal(t, "'+cmd|' /C calc'!A0", records[1][7])
	require.Equal(t, "'@SUM(1+1)", records[2][7])
	require.Equal(t, "'-2+3", records[2][8])
	require.Equal(t, "'\tx", records[3][7])
	require.Equal(t, "'\rx", records[3][8])
	require.Equal(t, "'=1+1", records[4][8])
	require.Equal(t, []string{"-5", "0", "1", "-7"}, records[4][9:13], "numbers stay numbers")
	require.Equal(t, "Usage: -2+3 by @SUM(1+1)", records[2][14])
	require.Equal(t, "'=1+1 included", records[5][14])
}
