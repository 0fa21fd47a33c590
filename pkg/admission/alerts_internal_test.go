package admission

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/event"
)

// An alert entry renders as a usage.threshold event whose id names its threshold and whose
// data says what the entry says, or is refused as malformed; never anything else.
func FuzzAlertEntry(f *testing.F) {
	head := "1|e1|node-1|||llm_call|tokens=10|acme|pro|acme:org/team-a:team|1795430400|1|2026-11|"
	f.Add(head + "acme:tokens|p80|800|805|2026-11|1")
	f.Add(head + "team-a:tokens|p100|100|95|2026-11-24|0")
	f.Add(head + "team-a:credits|b30|30|23|" + grant1 + "|1")
	f.Add(head + "acme:cost_micros|bp20|200|199|" + grant2 + "|1")
	f.Add(head + "acme:tokens|p80|800|805|" + grant1 + "|1")
	f.Add(head + "other:tokens|p80|800|805|2026-11|1")
	f.Fuzz(func(t *testing.T, e string) {
		key, v, err := OutboxMessage(map[string]any{"a": e})
		if err != nil {
			require.ErrorIs(t, err, ErrMalformedEntry)
			require.Equal(t, e, string(v))
			return
		}
		var ce event.CloudEvent
		require.NoError(t, json.Unmarshal(v, &ce), "%q renders %q", e, v)
		require.Equal(t, event.TypeThreshold, ce.Type)
		var d event.Threshold
		require.NoError(t, json.Unmarshal(ce.Data, &d))
		f := strings.Split(e, "|")
		if utf8.ValidString(key) { // else encoding/json replaced the invalid bytes
			require.Equal(t, d.Org, key)
		}
		require.Equal(t, f[13], d.Account+":"+d.Unit)
		window := d.Period
		if d.Grant != "" {
			window = d.Grant
		}
		require.Equal(t, ThresholdID(d.Account, d.Unit, f[14], window), ce.ID)
		require.Equal(t, d.Account, d.Path[len(d.Path)-1].Account)
		require.Equal(t, d.Kind == "quota_percent", d.Grant == "")
	})
}
