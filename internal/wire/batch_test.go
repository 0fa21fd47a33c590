package wire

import (
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The events of one script call come in one entry: each is rendered as it would be alone,
// in order; a part that cannot be read is passed on raw (the meter dead-letters it) and
// never hides the parts before it.
func TestOutboxMessagesOfACall(t *testing.T) {
	t.Parallel()
	usage := func(id string) string { return "1|" + id + "|n|||||acme|pro|acme:org|1795430840|294113|2026-11" }
	part := func(kind, body string) string { return kind + strconv.Itoa(len(body)) + ":" + body }
	entry := part("e", usage("e1")) + part("e", usage("e2|x")) + part("e", usage("e3"))
	got := OutboxMessages(map[string]any{"E": entry})
	require.Len(t, got, 3)
	for i, id := range []string{"e1", "e2|x", "e3"} {
		key, want, err := OutboxMessage(map[string]any{"e": usage(id)})
		require.Equal(t, Message{Key: key, Value: want, Err: err}, got[i], "event %d", i)
	}
	require.NoError(t, got[0].Err)
	require.Contains(t, string(got[0].Value), `"id":"e1"`)

	// A lone event, and other entries, are one message as OutboxMessage makes it.
	one := OutboxMessages(map[string]any{"e": usage("e1")})
	require.Equal(t, got[:1], one)
	kv := OutboxMessages(map[string]any{"k": "acme", "v": `{"specversion":"1.0"}`})
	require.Equal(t, []Message{{Key: "acme", Value: []byte(`{"specversion":"1.0"}`)}}, kv)

	// Broken lengths and kinds: what was read is kept, the rest goes on raw.
	for _, bad := range []string{"x3:abc", "e99:abc", "e-1:abc", "e3abc", "e:abc", "e1234567890:abc"} {
		got := OutboxMessages(map[string]any{"E": part("e", usage("ok")) + bad})
		require.Len(t, got, 2, bad)
		require.NoError(t, got[0].Err, bad)
		require.True(t, errors.Is(got[1].Err, ErrMalformedEntry), bad)
		require.Equal(t, bad, string(got[1].Value))
	}
}

func FuzzOutboxMessages(f *testing.F) {
	f.Add("e5:hello")
	f.Add("a3:abce2:xy")
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range OutboxMessages(map[string]any{"E": s}) {
			if m.Err == nil && len(m.Value) == 0 {
				t.Fatalf("an empty message without an error from %q", s)
			}
		}
	})
}
