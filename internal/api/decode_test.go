package api

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/policy"
)

func TestParseAdmit(t *testing.T) {
	long := strings.Repeat("k", MaxIdempotencyKey+1)
	huge := `{"api_key":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
	tests := []struct {
		name string
		body string
		code string // "" = valid
		want map[policy.Unit]int64
	}{
		{"defaults to one request", `{"api_key":"k"}`, "", map[policy.Unit]int64{policy.Requests: 1}},
		{"units as given", `{"account":"agent-1","units":{"requests":1,"tokens":2500}}`, "", map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}},
		{"tool adds credits", `{"api_key":"k","units":{"requests":1},"tool":"image_generate"}`, "", map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 10}},
		{"explicit credits win", `{"api_key":"k","units":{"credits":7},"tool":"llm_call"}`, "", map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 7}},
		{"requests default to 1", `{"api_key":"k","units":{"tokens":0}}`, "", map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 0}},
		{"zero requests allowed", `{"api_key":"k","units":{"requests":0,"tokens":9}}`, "", map[policy.Unit]int64{policy.Requests: 0, policy.Tokens: 9}},
		{"max key length", `{"api_key":"k","idempotency_key":"` + strings.Repeat("k", MaxIdempotencyKey) + `"}`, "", map[policy.Unit]int64{policy.Requests: 1}},
		{"not json", `nope`, "invalid_json", nil},
		{"empty body", ``, "invalid_json", nil},
		{"array", `[]`, "invalid_field", nil},
		{"trailing data", `{"api_key":"k"} {}`, "invalid_json", nil},
		{"unknown field", `{"api_key":"k","colour":"red"}`, "unknown_field", nil},
		{"no credentials", `{"units":{"requests":1}}`, "missing_credentials", nil},
		{"both credentials", `{"api_key":"k","account":"a"}`, "ambiguous_account", nil},
		{"bad account id", `{"account":"a b"}`, "invalid_account", nil},
		{"negative units", `{"api_key":"k","units":{"tokens":-1}}`, "invalid_units", nil},
		{"fractional units", `{"api_key":"k","units":{"tokens":1.5}}`, "invalid_units", nil},
		{"exponent units", `{"api_key":"k","units":{"tokens":1e3}}`, "invalid_units", nil},
		{"overflowing units", `{"api_key":"k","units":{"tokens":9223372036854775808}}`, "invalid_units", nil},
		{"string units", `{"api_key":"k","units":{"tokens":"5"}}`, "invalid_units", nil},
		{"null units", `{"api_key":"k","units":{"tokens":null}}`, "invalid_units", nil},
		{"unknown unit", `{"api_key":"k","units":{"gpus":1}}`, "unknown_unit", nil},
		{"unknown tool", `{"api_key":"k","tool":"teleport"}`, "unknown_tool", nil},
		{"long idempotency key", `{"api_key":"k","idempotency_key":"` + long + `"}`, "invalid_idempotency_key", nil},
		{"control char in key", `{"api_key":"k","idempotency_key":"a\u0000b"}`, "invalid_idempotency_key", nil},
		{"body too large", huge, "body_too_large", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, e := parseAdmit(strings.NewReader(tt.body), policy.ToolCredits, estimate.Options{})
			if tt.code == "" {
				require.Nil(t, e)
				require.Equal(t, tt.want, in.Units)
				return
			}
			require.NotNil(t, e, "want %s", tt.code)
			require.Equal(t, tt.code, e.Code, e.Message)
			require.Equal(t, 400, e.Status)
			require.NotEmpty(t, e.Message)
		})
	}
}

func TestParseOutcome(t *testing.T) {
	id, status, units, e := parseOutcome(strings.NewReader(`{"event_id":"e01-x","status":503,"units":{"tokens":1800}}`))
	require.Nil(t, e)
	require.Equal(t, "e01-x", id)
	require.Equal(t, 503, status)
	require.Equal(t, map[policy.Unit]int64{policy.Tokens: 1800}, units)
	for body, code := range map[string]string{
		`{"status":200}`:                                      "invalid_event_id",
		`{"event_id":"e","status":99}`:                        "invalid_status",
		`{"event_id":"e","status":"x"}`:                       "invalid_status",
		`{"event_id":"e","status":600}`:                       "invalid_status",
		`{"event_id":"e","status":200,"x":1}`:                 "unknown_field",
		`{"event_id":"e","status":200,"units":{"tokens":-5}}`: "invalid_units",
	} {
		_, _, _, e := parseOutcome(strings.NewReader(body))
		require.NotNil(t, e, body)
		require.Equal(t, code, e.Code, body)
	}
}

// FuzzParseAdmit: no input makes the decoder panic, and every refusal is a 4xx with a code;
// every acceptance has valid, non-negative units and credentials.
func FuzzParseAdmit(f *testing.F) {
	for _, s := range []string{
		`{"api_key":"k"}`, `{"account":"a","units":{"requests":1,"tokens":2500},"tool":"llm_call","idempotency_key":"x"}`,
		`{"units":{"tokens":-1}}`, `nope`, `{"api_key":"k"} 1`, `{"units":{"tokens":1e99}}`, `null`, `{"units":null}`,
		`{"api_key":"k","estimate":{"model":"gpt-4o","request":{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}}}`,
		`{"api_key":"k","estimate":{"provider":"anthropic","request":{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{ "api_key" : "k" , "units" : { "requests" : 0 , "tokens" : -0 } , "max_wait_ms" : 12 , "tool" : "x" } `))
	f.Add([]byte(`{"api_key":"k","units":{"tokens":01}}`))
	f.Add([]byte(`{"api_key":"k","API_KEY":"j"}`))
	f.Add([]byte(`{"account":"a","units":{"tokens":1,"Tokens":2}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		// What the fast decoder takes, the general one decodes the same way.
		if fast, ok := decodeAdmitFast(body); ok {
			var slow admitBody
			if e := decodeRaw(body, &slow); e != nil {
				t.Fatalf("decodeAdmitFast took %q, decodeRaw refuses it: %+v", body, e)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%q: decodeAdmitFast %+v, decodeRaw %+v", body, fast, slow)
			}
		}
		in, e := parseAdmit(strings.NewReader(string(body)), policy.ToolCredits, estimate.Options{})
		if e != nil {
			if e.Status < 400 || e.Status > 499 || e.Code == "" {
				t.Fatalf("refusal %+v is not a coded 4xx", e)
			}
			return
		}
		if (in.APIKey == "") == (in.Account == "") {
			t.Fatalf("accepted without exactly one credential: %+v", in)
		}
		if keys, entries, folded := keyCounts(t, body); keys != entries || folded {
			t.Fatalf("accepted a body that repeats a key: %q", body)
		}
		if len(in.Units) == 0 {
			t.Fatalf("accepted with no units: %+v", in)
		}
		for u, v := range in.Units {
			if !u.Valid() || v < 0 {
				t.Fatalf("accepted bad unit %s=%d", u, v)
			}
		}
		if in.Estimated != nil && in.Units[policy.Tokens] != in.Estimated.Total {
			t.Fatalf("charged %d tokens for an estimate of %d", in.Units[policy.Tokens], in.Estimated.Total)
		}
		if in.Estimated == nil && len(body) > MaxBodyBytes {
			t.Fatalf("accepted a %d-byte body without an estimate", len(body))
		}
	})
}

// FuzzParseEstimate: no body makes POST /v1/estimate's decoder panic or answer other than a
// coded 400; an estimate's parts add up and are not negative.
func FuzzParseEstimate(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","request":{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10}}`,
		`{"provider":"anthropic","request":{"model":"claude-x","max_tokens":5,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}}`,
		`{"request":{"model":"gpt-4","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=","detail":"high"}}]}]}}`,
		`{"model":"gpt-4o","request":[]}`, `{"request":null}`, `{}`, `{"model":"o3","provider":"google","request":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		est, e := parseEstimate(strings.NewReader(string(body)), estimate.Options{})
		if e != nil {
			if e.Status != 400 || e.Code == "" {
				t.Fatalf("refusal %+v is not a coded 400", e)
			}
			return
		}
		b := est.Breakdown
		if b.Text < 0 || b.Images < 0 || est.Output < 0 || b.Text+b.Overhead+b.Images != est.Input || est.Input+est.Output != est.Total {
			t.Fatalf("estimate does not add up: %+v", est)
		}
	})
}

func TestParseAdmitEstimate(t *testing.T) {
	req := `{"model":"gpt-4","request":{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10}}`
	in, e := parseAdmit(strings.NewReader(`{"api_key":"k","units":{"credits":2},"estimate":`+req+`}`), policy.ToolCredits, estimate.Options{})
	require.Nil(t, e)
	require.NotNil(t, in.Estimated)
	require.Equal(t, int64(19), in.Estimated.Total) // 9 in (see internal/estimate) + 10 out
	require.Equal(t, map[policy.Unit]int64{policy.Requests: 1, policy.Credits: 2, policy.Tokens: 19}, in.Units)

	// A model request may take admit's body past MaxBodyBytes, up to MaxEstimateBodyBytes.
	long := strings.Repeat("a ", MaxBodyBytes)
	in, e = parseAdmit(strings.NewReader(`{"api_key":"k","estimate":{"model":"llama","request":{"messages":[{"role":"user","content":"`+long+`"}],"max_tokens":0}}}`),
		policy.ToolCredits, estimate.Options{})
	require.Nil(t, e)
	require.Equal(t, int64((len(long)+len("user"))*2+6)/7+6, in.Units[policy.Tokens])

	for name, tc := range map[string]struct{ body, code string }{
		"tokens and estimate": {`{"api_key":"k","units":{"tokens":5},"estimate":` + req + `}`, "ambiguous_tokens"},
		"not a model request": {`{"api_key":"k","estimate":{"model":"gpt-4o","request":{"prompt":"x"}}}`, "invalid_estimate"},
		"no request":          {`{"api_key":"k","estimate":{"model":"gpt-4o"}}`, "invalid_estimate"},
		"unknown provider":    {`{"api_key":"k","estimate":{"provider":"google","request":{"model":"g","messages":[{"role":"user","content":"x"}]}}}`, "invalid_estimate"},
		"unknown field":       {`{"api_key":"k","estimate":{"model":"gpt-4o","request":{},"n":1}}`, "unknown_field"},
		"over 64 KiB without": {`{"api_key":"k","tool":"` + long + `"}`, "body_too_large"},
		"over 1 MiB":          {`{"api_key":"k","estimate":{"model":"x","request":{"messages":[{"role":"user","content":"` + strings.Repeat("a", MaxEstimateBodyBytes) + `"}]}}}`, "body_too_large"},
	} {
		_, e := parseAdmit(strings.NewReader(tc.body), policy.ToolCredits, estimate.Options{})
		require.NotNil(t, e, name)
		require.Equal(t, tc.code, e.Code, "%s: %s", name, e.Message)
		require.Equal(t, 400, e.Status, name)
	}
}

// FuzzParseOutcome: no input makes the outcome decoder panic; every acceptance has an
// event id, an HTTP status and non-negative units.
func FuzzParseOutcome(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"e","status":503,"units":{"tokens":1800}}`, `{"event_id":"e","status":"503"}`,
		`{"event_id":"","status":200}`, `{"status":1e3}`, `[]`, `{"event_id":"e","status":200,"units":{"tokens":-1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, status, units, e := parseOutcome(strings.NewReader(string(body)))
		if e != nil {
			if e.Status != 400 || e.Code == "" {
				t.Fatalf("refusal %+v is not a coded 400", e)
			}
			return
		}
		if id == "" || status < 100 || status > 599 {
			t.Fatalf("accepted id %q status %d", id, status)
		}
		for u, v := range units {
			if !u.Valid() || v < 0 {
				t.Fatalf("accepted bad unit %s=%d", u, v)
			}
		}
	})
}

func TestDuplicateKeys(t *testing.T) {
	for body, path := range map[string]string{
		`{"api_key":"k","api_key":"j"}`:                        "api_key",
		`{"api_key":"k","units":{"requests":1,"requests":-1}}`: "units.requests",
		`{"api_key":"k","API_KEY":"j"}`:                        "API_KEY",
		`{"api_key":"k","Api_Key":"j"}`:                        "Api_Key",
		`{"api_key":"k","\u0061pi_key":"j"}`:                   "api_key",
		`{"api_key":"k","estimate":{"request":{"messages":[{"role":"user","content":"a"},{"role":"user","role":"system"}]}}}`: "estimate.request.messages[1].role",
		`{"a":[[1,{"b":{"c":1,"d":2,"c":3}}]]}`:                                          "a[0][1].b.c",
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k4":4}`: "k4",
		`{"ſ":1,"S":2}`: "S", // encoding/json folds the long s with s
	} {
		e := decodeRaw([]byte(body), new(map[string]any))
		require.NotNil(t, e, body)
		require.Equal(t, "duplicate_key", e.Code, body)
		require.Equal(t, 400, e.Status)
		require.Contains(t, e.Message, strconv.Quote(path), body)
	}
	for _, body := range []string{
		`{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}`, // the same key in different objects
		`{"a":"a","b":"a"}`, `[{"a":1},{"a":1}]`, `"a"`, `{}`,
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10}`,
	} {
		require.Nil(t, decodeRaw([]byte(body), new(any)), body)
	}
	// Other bad input keeps its own code, a duplicate before it or not.
	for body, code := range map[string]string{
		`{"a":1,"a":`:           "invalid_json",
		`{"a":1} {"a":1,"a":2}`: "invalid_json",
		strings.Repeat("[", maxKeyDepth+1) + strings.Repeat("]", maxKeyDepth+1): "invalid_json",
	} {
		e := decodeRaw([]byte(body), new(any))
		require.NotNil(t, e, body)
		require.Equal(t, code, e.Code, body)
	}
	// Every decoder of a body refuses them: admit's, an outcome's, the admin API's.
	_, e := parseAdmit(strings.NewReader(`{"api_key":"k","units":{"tokens":1,"tokens":2}}`), policy.ToolCredits, estimate.Options{})
	require.Equal(t, "duplicate_key", e.Code)
	_, _, _, e = parseOutcome(strings.NewReader(`{"event_id":"e","status":200,"status":500}`))
	require.Equal(t, "duplicate_key", e.Code)
	require.Equal(t, "duplicate_key", decodeJSON(strings.NewReader(`{"id":"a","id":"b"}`), new(accountBody)).Code)
}

// keyCounts is the oracle of FuzzDuplicateKeys, with nothing in common with
// checkDuplicateKeys: keys counts the colons outside strings of a valid JSON value (one per
// key written), entries the keys of its objects once encoding/json has decoded them (a
// repeated key kept once), and folded whether some decoded object has two keys that
// differ only in case.
func keyCounts(t *testing.T, raw []byte) (keys, entries int, folded bool) {
	inString, escaped := false, false
	for _, c := range raw {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == ':':
			keys++
		}
	}
	var v any
	require.NoError(t, json.Unmarshal(raw, &v))
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			entries += len(v)
			var seen []string
			for k, x := range v {
				for _, s := range seen {
					folded = folded || strings.EqualFold(s, k)
				}
				seen = append(seen, k)
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	return keys, entries, folded
}

// FuzzDuplicateKeys: a valid JSON value is refused with duplicate_key exactly when one of
// its objects repeats a key (the oracle's colons outnumber the decoded keys) or has two
// keys that differ only in case; the refusal names a key the body has.
func FuzzDuplicateKeys(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"a":2}`, `{"a":1,"A":2}`, `{"a":{"b":[{"c":1},{"c":1,"c":2}]}}`, `{"a":"x:y","b":"\":"}`,
		`[{"a":1},{"a":1}]`, `{"\u0061":1,"a":2}`, `{"ſ":1,"s":2}`, `{"K":1,"k":2}`, `1`, `{"a":1,"a":`,
		`{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k4":4}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		e := checkDuplicateKeys(raw)
		if !json.Valid(raw) {
			return // the decoder refuses it; what the check said does not matter
		}
		keys, entries, folded := keyCounts(t, raw)
		if (keys > entries || folded) != (e != nil) {
			t.Fatalf("%d keys written, %d decoded, folded %v: check said %v", keys, entries, folded, e)
		}
		if e != nil && (e.Code != "duplicate_key" || e.Status != 400) {
			t.Fatalf("refusal %+v is not a 400 duplicate_key", e)
		}
	})
}

// What the duplicate-key check adds to decoding a body: an admit body, and a 1 MiB one with
// a model request to estimate.
func BenchmarkDuplicateKeys(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. ", (MaxEstimateBodyBytes-200)/45)
	for _, bm := range []struct{ name, body string }{
		{"admit", `{"api_key":"mgk_x","idempotency_key":"req-1","units":{"requests":1,"tokens":2500},"tool":"llm_call"}`},
		{"estimate-1MiB", `{"api_key":"k","estimate":{"model":"gpt-4o","request":{"messages":[{"role":"user","content":"` + text + `"}],"max_tokens":5}}}`},
	} {
		raw := []byte(bm.body)
		b.Run(bm.name+"/check", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if e := checkDuplicateKeys(raw); e != nil {
					b.Fatal(e)
				}
			}
		})
		b.Run(bm.name+"/decode", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if e := decodeRaw(raw, new(admitBody)); e != nil {
					b.Fatal(e)
				}
			}
		})
	}
}
