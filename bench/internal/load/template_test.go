package load

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTemplate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		body        string
		items       []string
		idempotency bool
		seq         uint64
		want        map[string]any // the rendered body, without an idempotency_key
		wantErr     string
	}{
		{name: "plain", body: `{"units":{"requests":1}}`,
			want: map[string]any{"units": map[string]any{"requests": 1.0}}},
		{name: "items round robin", body: `{"api_key":"{{item}}"}`, items: []string{"k0", "k1", "k2"}, seq: 4,
			want: map[string]any{"api_key": "k1"}},
		{name: "items escaped", body: `{"account":"{{item}}"}`, items: []string{`a"b\c`},
			want: map[string]any{"account": `a"b\c`}},
		{name: "seq", body: `{"n":{{seq}},"s":"r-{{seq}}"}`, seq: 42,
			want: map[string]any{"n": 42.0, "s": "r-42"}},
		{name: "idempotency added", body: " {\"account\":\"a\"}\n", idempotency: true,
			want: map[string]any{"account": "a"}},
		{name: "idempotency added to empty object", body: `{ }`, idempotency: true,
			want: map[string]any{}},
		{name: "idempotency placed by template", body: `{"idempotency_key":"x-{{idem}}"}`, idempotency: true,
			want: map[string]any{}},
		{name: "item without items", body: `{"account":"{{item}}"}`, wantErr: "item list is empty"},
		{name: "not JSON", body: `{"account":}`, wantErr: "valid JSON"},
		{name: "idempotency on an array", body: `[1]`, idempotency: true, wantErr: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tmpl, err := NewTemplate(tt.body, tt.items, tt.idempotency)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var got map[string]any
			require.NoError(t, json.Unmarshal(tmpl.Render(nil, tt.seq), &got))
			if tt.idempotency {
				key, ok := got["idempotency_key"].(string)
				require.True(t, ok, "no idempotency_key in %v", got)
				require.NotEqual(t, key, idemOf(t, tmpl, tt.seq+1))
				delete(got, "idempotency_key")
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestIdempotencyKeysDifferAcrossRuns(t *testing.T) {
	t.Parallel()
	a, err := NewTemplate(`{}`, nil, true)
	require.NoError(t, err)
	b, err := NewTemplate(`{}`, nil, true)
	require.NoError(t, err)
	require.NotEqual(t, idemOf(t, a, 0), idemOf(t, b, 0))
}

func idemOf(t *testing.T, tmpl *Template, seq uint64) string {
	t.Helper()
	var body struct {
		IdempotencyKey string `json:"idempotency_key"`
	}
	require.NoError(t, json.Unmarshal(tmpl.Render(nil, seq), &body))
	return body.IdempotencyKey
}

func BenchmarkRender(b *testing.B) {
	tmpl, err := NewTemplate(`{"api_key":"{{item}}","units":{"requests":1,"tokens":250}}`,
		[]string{"mgk_a", "mgk_b"}, true)
	require.NoError(b, err)
	b.ReportAllocs() // b.Loop times only the loop, so no ResetTimer
	var buf []byte
	for i := 0; b.Loop(); i++ {
		buf = tmpl.Render(buf[:0], uint64(i))
	}
}
