package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// Message is one Kafka message of an outbox entry: its key (the org) and value.
type Message struct {
	Key   string
	Value []byte
	// Err is set for a part of the entry that could not be read: Value is then its raw
	// text, which the meter keeps in dead_letters (as OutboxMessage does).
	Err error
}

// OutboxMessages returns the Kafka messages of an outbox stream entry, in order: the
// events of one script call of lua/admit.lua ("E": each "<kind><length>:<body>", kind "e"
// a compact usage event or "a" a threshold event, length in bytes), or the one message of
// any other entry (OutboxMessage). A part that cannot be read is returned raw, with its
// error in Err; a field "E" that cannot be split is returned whole, raw, as one message.
func OutboxMessages(values map[string]any) []Message {
	all, ok := values["E"].(string)
	if !ok {
		key, value, err := OutboxMessage(values)
		return []Message{{Key: key, Value: value, Err: err}}
	}
	var out []Message
	for rest := all; rest != ""; {
		kind, body, next, err := nextEvent(rest)
		if err != nil {
			return append(out, Message{Value: []byte(rest), Err: fmt.Errorf("%w: %w", ErrMalformedEntry, err)})
		}
		key, value, err := OutboxMessage(map[string]any{kind: body})
		out = append(out, Message{Key: key, Value: value, Err: err})
		rest = next
	}
	return out
}

// nextEvent reads "<kind><length>:<body>" from the start of s.
func nextEvent(s string) (kind, body, rest string, err error) {
	if s[0] != 'e' && s[0] != 'a' {
		return "", "", "", fmt.Errorf("event kind %q", s[0])
	}
	n, after, ok := strings.Cut(s[1:], ":")
	size, perr := strconv.Atoi(n)
	if !ok || perr != nil || size < 0 || size > len(after) || len(n) > 9 {
		return "", "", "", fmt.Errorf("event length %q", n)
	}
	return s[:1], after[:size], after[size:], nil
}
