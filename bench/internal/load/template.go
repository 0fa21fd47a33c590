package load

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Placeholders a body template may hold. They are replaced by plain text, so put them
// inside JSON strings: "account":"{{item}}".
const (
	PlaceholderItem = "{{item}}" // the next value of the item list, round robin
	PlaceholderIdem = "{{idem}}" // an idempotency key unique to this request and run
	PlaceholderSeq  = "{{seq}}"  // the request's sequence number in this run, from 0
)

// Template renders request bodies. It is split once into literal and placeholder parts, so
// rendering is an append per part: the load generator must not be what limits the rate.
type Template struct {
	parts []part
	items []string // JSON-escaped, without quotes
	runID string
}

type part struct {
	lit  string
	hole string // one of the placeholders, or "" for a literal
}

// NewTemplate parses body. items feed {{item}} (each is JSON-escaped, so any string is
// safe inside a JSON string); a template using {{item}} needs at least one. With
// idempotency, a template without {{idem}} gets "idempotency_key":"{{idem}}" added to its
// top-level object. The result must render to valid JSON.
func NewTemplate(body string, items []string, idempotency bool) (*Template, error) {
	body = strings.TrimSpace(body)
	if idempotency && !strings.Contains(body, PlaceholderIdem) {
		var err error
		if body, err = addField(body, "idempotency_key", PlaceholderIdem); err != nil {
			return nil, err
		}
	}
	t := &Template{parts: split(body), runID: newRunID()}
	for _, it := range items {
		quoted, err := json.Marshal(it)
		if err != nil {
			return nil, fmt.Errorf("item %q: %w", it, err)
		}
		t.items = append(t.items, string(quoted[1:len(quoted)-1]))
	}
	if strings.Contains(body, PlaceholderItem) && len(t.items) == 0 {
		return nil, errors.New("body template uses {{item}} but the item list is empty")
	}
	if sample := t.Render(nil, 0); !json.Valid(sample) {
		return nil, fmt.Errorf("body template does not render to valid JSON: %s", sample)
	}
	return t, nil
}

// Render appends the body of request seq to dst.
func (t *Template) Render(dst []byte, seq uint64) []byte {
	for _, p := range t.parts {
		switch p.hole {
		case "":
			dst = append(dst, p.lit...)
		case PlaceholderItem:
			dst = append(dst, t.items[seq%uint64(len(t.items))]...)
		case PlaceholderIdem:
			dst = append(dst, t.runID...)
			dst = append(dst, '-')
			dst = strconv.AppendUint(dst, seq, 10)
		case PlaceholderSeq:
			dst = strconv.AppendUint(dst, seq, 10)
		}
	}
	return dst
}

// split cuts body at every placeholder.
func split(body string) []part {
	holes := []string{PlaceholderItem, PlaceholderIdem, PlaceholderSeq}
	var parts []part
	for body != "" {
		at, hole := len(body), ""
		for _, h := range holes {
			if i := strings.Index(body, h); i >= 0 && i < at {
				at, hole = i, h
			}
		}
		if at > 0 {
			parts = append(parts, part{lit: body[:at]})
		}
		if hole == "" {
			break
		}
		parts = append(parts, part{hole: hole})
		body = body[at+len(hole):]
	}
	return parts
}

// addField inserts "name":"value" as the last member of the top-level object body.
func addField(body, name, value string) (string, error) {
	if !strings.HasPrefix(body, "{") || !strings.HasSuffix(body, "}") {
		return "", fmt.Errorf("add %s: body template is not a JSON object", name)
	}
	field := strconv.Quote(name) + ":" + strconv.Quote(value)
	inner := bytes.TrimSpace([]byte(body[1 : len(body)-1]))
	if len(inner) == 0 {
		return "{" + field + "}", nil
	}
	return "{" + string(inner) + "," + field + "}", nil
}

// newRunID keeps idempotency keys of two runs against the same Redis apart.
func newRunID() string {
	var raw [8]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand panics instead)
	return "lg-" + hex.EncodeToString(raw[:])
}
