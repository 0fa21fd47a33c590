package meter

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// decodeJSON is what encoding/json makes of a message: the envelope, and the data of a known
// type if there is data, whatever the rest of the envelope holds.
func decodeJSON(value []byte) (wire.Decoded, error) {
	var m wire.Decoded
	if err := json.Unmarshal(value, &m.CloudEvent); err != nil || m.CloudEvent.Data == nil {
		return m, err
	}
	switch m.CloudEvent.Type {
	case event.TypeAdmitted:
		m.Admitted = new(event.Admitted)
		return m, json.Unmarshal(m.CloudEvent.Data, m.Admitted)
	case event.TypeOutcome:
		m.Outcome = new(event.Outcome)
		return m, json.Unmarshal(m.CloudEvent.Data, m.Outcome)
	}
	return m, nil
}

// requireDecodedAsJSON checks that what wire.DecodeFast accepts, encoding/json decodes the same.
func requireDecodedAsJSON(t testing.TB, value []byte) bool {
	t.Helper()
	fast, ok := wire.DecodeFast(value)
	if !ok {
		return false
	}
	slow, err := decodeJSON(value)
	require.NoError(t, err, "encoding/json refuses what decodeFast accepted: %q", value)
	require.Equal(t, slow, fast, "%q", value)
	return true
}

func TestDecodeFast(t *testing.T) {
	t.Parallel()
	admitted, outcome := asAdmit(t, encode(t, goodAdmitted())), asAdmit(t, encode(t, goodOutcome()))
	change := func(value []byte, from, to string) []byte {
		require.Contains(t, string(value), from)
		return []byte(strings.Replace(string(value), from, to, 1))
	}
	indented := func(value []byte) []byte {
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(value, &ce))
		b, err := json.MarshalIndent(ce, "", "\t")
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name  string
		value []byte
		fast  bool // taken by decodeFast, else left to encoding/json
	}{
		{"admitted as admit writes it", admitted, true},
		{"outcome as admit writes it", outcome, true},
		{"indented", indented(admitted), true},
		{"fail open", change(admitted, `"tool"`, `"fail_open":true,"tool"`), true},
		{"empty path and units", change(change(admitted, `"units":{"cost_micros":1200,"credits":3,"requests":1,"tokens":2500}`, `"units":{}`),
			`"path":[{"account":"acme","kind":"org"},{"account":"eng","kind":"team"},{"account":"alice","kind":"user"},{"account":"agent-1","kind":"agent"}]`, `"path":[]`), true},
		{"negative zero and a negative unit", change(admitted, `"credits":3,"requests":1`, `"credits":-0,"requests":-1`), true},
		{"borrowed", change(admitted, `"tool"`, `"borrowed":[{"account":"eng","from":"acme","unit":"tokens","units":300},{"account":"alice","from":"eng","unit":"requests","units":1}],"tool"`), true},
		{"borrowed nothing", change(admitted, `"tool"`, `"borrowed":[ ],"tool"`), true},
		{"borrowing with an unknown member", change(admitted, `"tool"`, `"borrowed":[{"account":"eng","from":"acme","unit":"tokens","units":300,"x":1}],"tool"`), false},
		{"borrowing repeated member", change(admitted, `"tool"`, `"borrowed":[{"account":"eng","account":"x","from":"acme","unit":"tokens","units":300}],"tool"`), false},
		{"borrowed null", change(admitted, `"tool"`, `"borrowed":null,"tool"`), false},
		{"borrowed not an array", change(admitted, `"tool"`, `"borrowed":{},"tool"`), false},
		{"borrowed trailing comma", change(admitted, `"tool"`, `"borrowed":[{"account":"eng","from":"acme","unit":"tokens","units":1},],"tool"`), false},
		{"credits", change(admitted, `"tool"`, `"borrowed":[{"account":"eng","from":"acme","unit":"tokens","units":300}],"credits":[{"account":"acme","unit":"tokens","grant":"`+grant1+`","units":1000},{"account":"alice","unit":"requests","grant":"`+grant2+`","units":1}],"tool"`), true},
		{"credits before borrowed", change(admitted, `"tool"`, `"credits":[{"units":1,"grant":"x","unit":"tokens","account":"acme"}],"borrowed":[],"tool"`), true},
		{"drew nothing", change(admitted, `"tool"`, `"credits":[ ],"tool"`), true},
		{"draw with an unknown member", change(admitted, `"tool"`, `"credits":[{"account":"acme","unit":"tokens","grant":"x","units":1,"from":"acme"}],"tool"`), false},
		{"draw with a repeated member", change(admitted, `"tool"`, `"credits":[{"account":"acme","unit":"tokens","grant":"x","grant":"y","units":1}],"tool"`), false},
		{"credits null", change(admitted, `"tool"`, `"credits":null,"tool"`), false},
		{"credits repeated", change(admitted, `"tool"`, `"credits":[],"credits":[],"tool"`), false},
		{"credits not an array", change(admitted, `"tool"`, `"credits":{},"tool"`), false},
		{"credits trailing comma", change(admitted, `"tool"`, `"credits":[{"account":"acme","unit":"tokens","grant":"x","units":1},],"tool"`), false},
		{"unknown type", change(admitted, event.TypeAdmitted, "io.metergate.usage.refunded.v1"), false},
		{"data before type", encode(t, goodAdmitted()), false},
		{"escape", change(admitted, `"plan":"pro"`, `"plan":"pr\u006f"`), false},
		{"non-ASCII", change(admitted, `"plan":"pro"`, `"plan":"prö"`), false},
		{"unknown member", change(admitted, `"plan"`, `"planet":"x","plan"`), false},
		{"member in capitals", change(admitted, `"plan"`, `"PLAN"`), false},
		{"repeated member", change(admitted, `"plan":"pro"`, `"plan":"pro","plan":"free"`), false},
		{"repeated unit", change(admitted, `"credits":3`, `"credits":3,"credits":4`), false},
		{"null", change(admitted, `"plan":"pro"`, `"plan":null`), false},
		{"fraction", change(admitted, `"credits":3`, `"credits":3.0`), false},
		{"exponent", change(admitted, `"credits":3`, `"credits":3e0`), false},
		{"leading zero", change(admitted, `"credits":3`, `"credits":03`), false},
		{"too large", change(admitted, `"credits":3`, `"credits":9223372036854775808`), false},
		{"status too large", change(outcome, `"status":200`, `"status":9223372036854775808`), false},
		{"bad time", change(admitted, `"time":"2026-11-23T10:47:20.294404Z"`, `"time":"2026-11-23 10:47:20Z"`), false},
		{"trailing comma", change(admitted, `"plan":"pro"`, `"plan":"pro",`), false},
		{"trailing bytes", append(admitted[:len(admitted):len(admitted)], "x"...), false},
		{"cut short", admitted[:len(admitted)-1], false},
		{"data not an object", change(outcome, `"data":{`, `"data":[{`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.fast, requireDecodedAsJSON(t, tc.value), "taken by decodeFast")
		})
	}
}

// FuzzDecode: whatever wire.DecodeFast accepts, encoding/json decodes the same way.
func FuzzDecode(f *testing.F) {
	f.Add(asAdmit(f, encode(f, goodAdmitted())))
	f.Add(asAdmit(f, encode(f, goodOutcome())))
	for _, tc := range malformed {
		value := tc.value(f)
		var ce event.CloudEvent
		if json.Unmarshal(value, &ce) == nil {
			value = encode(f, ce)
		}
		f.Add(value)
	}
	// FuzzParse's corpus too.
	files, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParse", "*"))
	require.NoError(f, err)
	for _, file := range files {
		b, err := os.ReadFile(file)
		require.NoError(f, err)
		var value []byte
		// go test fuzz v1: the second line is []byte("...")
		if lines := strings.SplitN(string(b), "\n", 3); len(lines) >= 2 {
			if s, ok := strings.CutPrefix(strings.TrimSpace(lines[1]), "[]byte("); ok {
				if unq, err := strconv.Unquote(strings.TrimSuffix(s, ")")); err == nil {
					value = []byte(unq)
				}
			}
		}
		if value != nil {
			f.Add(value)
		}
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		requireDecodedAsJSON(t, value)
	})
}
