package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// read decodes text as an object of strings, integers, booleans and arrays of strings,
// the way a caller of Scanner does.
func read(text string) (map[string]any, bool) {
	d := New([]byte(text))
	out := map[string]any{}
	ok := d.Object(func(key string) bool {
		if _, dup := out[key]; dup {
			return false
		}
		switch key {
		case "s":
			v, ok := d.String()
			out[key] = v
			return ok
		case "n":
			v, ok := d.Int()
			out[key] = json.Number(v)
			return ok
		case "b":
			v, ok := d.Bool()
			out[key] = v
			return ok
		case "a":
			var a []any
			ok := d.Array(func() bool {
				v, ok := d.String()
				a = append(a, v)
				return ok
			})
			out[key] = a
			return ok
		}
		return false
	})
	return out, ok && d.End()
}

func TestScanner(t *testing.T) {
	for _, tc := range []struct {
		text string
		ok   bool
	}{
		{`{}`, true},
		{` { "s" : "x y" , "n" : -12 , "b" : true , "a" : [ "p" , "q" ] } `, true},
		{"{\n\"n\":0,\t\"b\":false,\"a\":[]}", true},
		{`{"s":"a\"b"}`, false}, // an escape
		{`{"s":"é"}`, false},    // not ASCII
		{`{"n":1.5}`, false},    // a fraction
		{`{"n":1e3}`, false},    // an exponent
		{`{"n":012}`, false},    // a leading zero
		{`{"n":-}`, false},      // no digits
		{`{"s":null}`, false},   // null
		{`{"s":"x"} x`, false},  // something after
		{`{"s":"x",}`, false},   // a trailing comma
		{`{"a":["x",]}`, false}, // in an array too
		{`{"s":"x"`, false},     // cut short
		{`{"z":1}`, false},      // a member the caller does not take
	} {
		got, ok := read(tc.text)
		require.Equal(t, tc.ok, ok, tc.text)
		if !ok {
			continue
		}
		var want map[string]any
		dec := json.NewDecoder(strings.NewReader(tc.text))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&want), tc.text)
		require.Equal(t, len(want), len(got), tc.text)
		for k, v := range want {
			if a, isArray := v.([]any); isArray && len(a) == 0 {
				require.Empty(t, got[k], tc.text)
				continue
			}
			require.Equal(t, v, got[k], "%s: %s", tc.text, k)
		}
	}
}

// Since is the raw text of a value, as encoding/json's RawMessage holds it.
func TestSinceIsTheValue(t *testing.T) {
	d := New([]byte(`{"s":  "abc" }`))
	var raw []byte
	require.True(t, d.Object(func(string) bool {
		start := d.Pos()
		_, ok := d.String()
		raw = d.Since(start)
		return ok
	}))
	require.Equal(t, `"abc"`, string(raw))
	require.Equal(t, len(raw), cap(raw), "an append to it copies")
}

// Int alone leaves to encoding/json what it does not read whole.
func TestIntWhole(t *testing.T) {
	for text, want := range map[string]string{"0": "0", "-7 ": "-7", "120": "120", "012": "", "1.5": "", "2e3": "", "-": "", "x": ""} {
		d := New([]byte(text))
		got, ok := d.Int()
		require.Equal(t, want != "", ok, text)
		require.Equal(t, want, string(got), text)
	}
}
