package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/jsonscan"
	"github.com/metergate/metergate/internal/policy"
)

// MaxBodyBytes bounds every request body but those that carry a model request to estimate
// and an amendment's (MaxAmendmentBodyBytes).
const MaxBodyBytes = 64 << 10

// MaxEstimateBodyBytes bounds the bodies that carry a model request to estimate: POST
// /v1/estimate, and POST /v1/admit with an estimate (without one, admit's body is still
// bounded by MaxBodyBytes).
const MaxEstimateBodyBytes = 1 << 20

// bodyLimit is the most bytes a request to path may send.
func bodyLimit(path string) int {
	switch path {
	case "/v1/admit", "/v1/estimate":
		return MaxEstimateBodyBytes
	case "/v1/admin/amendments":
		return MaxAmendmentBodyBytes
	}
	return MaxBodyBytes
}

func bodyTooLarge(limit int) *Error {
	return &Error{Status: 400, Code: "body_too_large", Message: fmt.Sprintf("the body is larger than %d bytes", limit)}
}

// MaxIdempotencyKey is the longest idempotency key accepted, in bytes.
const MaxIdempotencyKey = 255

// Error is a client error: an HTTP status with a stable code and a message for people;
// the gate's refusals are of the same type.
type Error = gate.Error

func badRequest(code, format string, args ...any) *Error {
	return &Error{Status: 400, Code: code, Message: fmt.Sprintf(format, args...)}
}

// decodeJSON reads one JSON object from body into v: unknown fields, trailing data and
// bodies over MaxBodyBytes are refused.
func decodeJSON(body io.Reader, v any) *Error {
	_, e := decodeJSONMax(body, v, MaxBodyBytes)
	return e
}

// decodeJSONMax is decodeJSON for bodies of up to limit bytes; it returns the body's size.
func decodeJSONMax(body io.Reader, v any, limit int) (int, *Error) {
	raw, e := readBody(body, limit)
	if e != nil {
		return len(raw), e
	}
	return len(raw), decodeRaw(raw, v)
}

// readBody reads a body of up to limit bytes (one more when it is larger, with
// body_too_large).
func readBody(body io.Reader, limit int) ([]byte, *Error) {
	raw, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err != nil {
		return nil, badRequest("unreadable_body", "could not read the request body")
	}
	if len(raw) > limit {
		return raw, bodyTooLarge(limit)
	}
	return raw, nil
}

// decodeRaw decodes raw into v as decodeJSON does, after refusing a duplicate key
// (checkDuplicateKeys).
func decodeRaw(raw []byte, v any) *Error {
	if e := checkDuplicateKeys(raw); e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		switch {
		case errors.As(err, &ute):
			return badRequest("invalid_field", "field %q must be %s", ute.Field, ute.Type.String())
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return badRequest("unknown_field", "%s", strings.TrimPrefix(err.Error(), "json: "))
		case errors.Is(err, io.EOF):
			return badRequest("invalid_json", "the body is empty; a JSON object is expected")
		default:
			return badRequest("invalid_json", "the body is not valid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
		}
	}
	if err := dec.Decode(new(json.RawMessage)); !errors.Is(err, io.EOF) {
		return badRequest("invalid_json", "the body has data after the JSON object")
	}
	return nil
}

// maxKeyDepth is the deepest nesting checkDuplicateKeys follows: encoding/json's own limit,
// so that a body it refuses for depth keeps that refusal (invalid_json).
const maxKeyDepth = 10000

// keyFrame is an object or array checkDuplicateKeys is inside.
type keyFrame struct {
	object  bool
	wantKey bool                // object: the next string is a key
	key     string              // object: the last key read
	index   int                 // array: the index of the next value
	keys    []string            // object: its keys so far, folded (few keys)
	keySet  map[string]struct{} // object: the same, once there are many
}

// checkDuplicateKeys refuses a JSON value with an object, at any depth, that has a key twice
// (400 duplicate_key naming the key's path): encoding/json would keep the last value
// silently, so two readers of one body (a proxy and admit, a log and the decoder) could
// see different requests. Keys that differ only in case count as the same, because
// encoding/json matches a struct's field names regardless of case ("API_KEY" sets
// api_key). raw is read once, as a stream of tokens; anything but a duplicate (bad JSON,
// nesting past maxKeyDepth, data after the value) is left for the decoder to refuse with
// its own code, a duplicate before it or not.
func checkDuplicateKeys(raw []byte) *Error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // numbers are not parsed: their text is enough
	var (
		stack []keyFrame
		dup   *Error // the first duplicate: returned once the value proves to be JSON
	)
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		var top *keyFrame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		if s, ok := tok.(string); ok && top != nil && top.object && top.wantKey {
			seen := top.add(s)
			top.key, top.wantKey = s, false
			if seen && dup == nil {
				dup = badRequest("duplicate_key", "the key %q appears twice in one object (keys that differ only in case count as the same)", keyPath(stack))
			}
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= maxKeyDepth {
				return nil
			}
			stack = append(stack, keyFrame{object: tok == json.Delim('{'), wantKey: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return dup // the first value is checked; the decoder refuses trailing data
			}
			top = &stack[len(stack)-1]
		}
		// A value ended (a scalar, or the object or array just closed).
		switch {
		case top == nil:
			return nil // a scalar body
		case top.object:
			top.wantKey = true
		default:
			top.index++
		}
	}
}

// smallObject is how many keys an object's frame compares one by one before a map.
const smallObject = 8

// add records key in an object's frame and reports whether it had it already (folded).
func (f *keyFrame) add(key string) bool {
	k := foldKey(key)
	if f.keySet == nil && len(f.keys) < smallObject {
		for _, seen := range f.keys {
			if seen == k {
				return true
			}
		}
		f.keys = append(f.keys, k)
		return false
	}
	if f.keySet == nil {
		f.keySet = make(map[string]struct{}, 2*smallObject)
		for _, seen := range f.keys {
			f.keySet[seen] = struct{}{}
		}
		f.keys = nil
	}
	if _, ok := f.keySet[k]; ok {
		return true
	}
	f.keySet[k] = struct{}{}
	return false
}

// foldKey folds a key as encoding/json does when it matches field names: ASCII letters to
// upper case, other runes to the smallest rune of their case-folding orbit; two keys fold
// alike exactly when strings.EqualFold says they are equal, when one struct field would
// take both.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		switch {
		case 'a' <= r && r <= 'z':
			r -= 'a' - 'A'
		case r >= utf8.RuneSelf:
			for {
				next := unicode.SimpleFold(r)
				if next <= r {
					r = next
					break
				}
				r = next
			}
		}
		b.WriteRune(r)
	}
	return b.String()
}

// keyPath names the key just read: units.tokens, estimate.request.messages[0].role.
func keyPath(stack []keyFrame) string {
	var b strings.Builder
	for _, f := range stack {
		switch {
		case f.object && !f.wantKey: // the key whose value holds the rest
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		case !f.object:
			fmt.Fprintf(&b, "[%d]", f.index)
		}
	}
	return b.String()
}

// decodeUnits turns {"tokens": 2500, ...} into units, refusing unknown units and values
// that are not non-negative integers (a number in quotes included).
func decodeUnits(in map[string]json.RawMessage) (map[policy.Unit]int64, *Error) {
	out := make(map[policy.Unit]int64, len(in))
	for name, raw := range in {
		u := policy.Unit(name)
		if !u.Valid() {
			return nil, badRequest("unknown_unit", "unknown unit %q (known: requests, tokens, credits, cost_micros)", name)
		}
		v, err := jsonInt(raw)
		if errors.Is(err, strconv.ErrRange) || err == nil && v > policy.MaxAmount {
			return nil, unitsTooLarge("units." + name)
		}
		if err != nil {
			return nil, badRequest("invalid_units", "units.%s must be a whole number, got %.40s", name, raw)
		}
		if v < 0 {
			return nil, badRequest("invalid_units", "units.%s must not be negative", name)
		}
		out[u] = v
	}
	return out, nil
}

// unitsTooLarge refuses an amount of units past policy.MaxAmount, naming where it was.
func unitsTooLarge(field string) *Error {
	return badRequest("invalid_units", "%s must be at most %d (10^15)", field, int64(policy.MaxAmount))
}

// jsonInt parses a JSON number that is a whole int64, written without fraction or exponent.
func jsonInt(raw json.RawMessage) (int64, error) {
	return strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
}

// validIdempotencyKey: 1-255 printable ASCII characters without spaces.
func validIdempotencyKey(k string) *Error {
	if len(k) > MaxIdempotencyKey {
		return badRequest("invalid_idempotency_key", "idempotency_key is longer than %d characters", MaxIdempotencyKey)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return badRequest("invalid_idempotency_key", "idempotency_key may hold only printable ASCII without spaces")
		}
	}
	return nil
}

// estimateBody is the body of POST /v1/estimate and the estimate of POST /v1/admit: a
// model request whose tokens are estimated (internal/estimate).
type estimateBody struct {
	Model    string          `json:"model"`
	Provider string          `json:"provider"`
	Request  json.RawMessage `json:"request"`
}

// count estimates b's tokens.
func (b estimateBody) count(opt estimate.Options) (estimate.Estimate, *Error) {
	est, err := estimate.Count(estimate.Input{Model: b.Model, Provider: estimate.Provider(b.Provider), Request: b.Request}, opt)
	switch {
	case errors.Is(err, estimate.ErrInvalid):
		return est, badRequest("invalid_estimate", "%s", err.Error())
	case err != nil:
		return est, &Error{Status: 500, Code: "internal", Message: "the estimator failed"}
	}
	return est, nil
}

// parseEstimate decodes the body of POST /v1/estimate and estimates it.
func parseEstimate(body io.Reader, opt estimate.Options) (estimate.Estimate, *Error) {
	var b estimateBody
	if _, e := decodeJSONMax(body, &b, MaxEstimateBodyBytes); e != nil {
		return estimate.Estimate{}, e
	}
	return b.count(opt)
}

// admitBody is the body of POST /v1/admit.
type admitBody struct {
	APIKey         string                     `json:"api_key"`
	Account        string                     `json:"account"`
	IdempotencyKey string                     `json:"idempotency_key"`
	Units          map[string]json.RawMessage `json:"units"`
	Tool           string                     `json:"tool"`
	Estimate       *estimateBody              `json:"estimate"`
	MaxWaitMS      json.RawMessage            `json:"max_wait_ms"`
}

// admitInput is a validated admitBody.
type admitInput struct {
	APIKey         string
	Account        string
	IdempotencyKey string
	Units          map[policy.Unit]int64
	Tool           string
	// Estimated is the estimate that gave Units' tokens, if the body had one.
	Estimated *estimate.Estimate
	// MaxWaitMS is how long the request may wait for capacity, ms (0: not at all); not yet
	// checked against the deployment's bound (maxWait).
	MaxWaitMS int64
}

// parseAdmit decodes and validates the body of POST /v1/admit. tools prices tool calls in
// credits: a known tool adds its credits unless the request names credits itself. An
// estimate's total becomes the tokens units; a body without one is bounded by MaxBodyBytes.
func parseAdmit(body io.Reader, tools map[string]int64, opt estimate.Options) (admitInput, *Error) {
	var b admitBody
	raw, e := readBody(body, MaxEstimateBodyBytes)
	if e == nil {
		var ok bool
		if b, ok = decodeAdmitFast(raw); !ok {
			e = decodeRaw(raw, &b)
		}
	}
	if e == nil && len(raw) > MaxBodyBytes && b.Estimate == nil {
		e = bodyTooLarge(MaxBodyBytes) // only a model request to estimate may take a body past it
	}
	if e != nil {
		return admitInput{}, e
	}
	in := admitInput{APIKey: b.APIKey, Account: b.Account, IdempotencyKey: b.IdempotencyKey, Tool: b.Tool}
	switch {
	case b.APIKey == "" && b.Account == "":
		return in, badRequest("missing_credentials", "give api_key, or account for a trusted caller")
	case b.APIKey != "" && b.Account != "":
		return in, badRequest("ambiguous_account", "give api_key or account, not both")
	case b.Account != "" && !policy.ValidID(b.Account):
		return in, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	case len(b.APIKey) > 256:
		return in, &Error{Status: 401, Code: "unknown_api_key", Message: "the API key is not known"}
	}
	if e := validIdempotencyKey(b.IdempotencyKey); e != nil {
		return in, e
	}
	if in.MaxWaitMS, e = decodeMaxWait(b.MaxWaitMS); e != nil {
		return in, e
	}
	units, e := decodeUnits(b.Units)
	if e != nil {
		return in, e
	}
	if b.Estimate != nil {
		if _, set := units[policy.Tokens]; set {
			return in, badRequest("ambiguous_tokens", "give units.tokens or estimate, not both")
		}
		est, e := b.Estimate.count(opt)
		if e != nil {
			return in, e
		}
		if est.Total > policy.MaxAmount {
			return in, unitsTooLarge("the estimate's tokens (max_tokens)")
		}
		units[policy.Tokens], in.Estimated = est.Total, &est
	}
	if _, set := units[policy.Requests]; !set {
		units[policy.Requests] = 1 // every call is a request unless the caller says otherwise
	}
	if b.Tool != "" {
		cost, ok := tools[b.Tool]
		if !ok {
			return in, badRequest("unknown_tool", "unknown tool %q", b.Tool)
		}
		if _, set := units[policy.Credits]; !set {
			units[policy.Credits] = cost
		}
	}
	in.Units = units
	return in, nil
}

// decodeMaxWait reads max_wait_ms: absent, null or 0 is no wait; otherwise a whole number
// of milliseconds, written without fraction or exponent.
func decodeMaxWait(raw json.RawMessage) (int64, *Error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	ms, err := jsonInt(raw)
	if err != nil || ms < 0 {
		return 0, badRequest("invalid_max_wait", "max_wait_ms must be a whole number of milliseconds, 0 or more, got %.40s", raw)
	}
	return ms, nil
}

// maxWait checks a request's max_wait_ms against the deployment's bound, limit
// (ADMIT_MAX_WAIT; 0 disables waiting).
func maxWait(ms int64, limit time.Duration) (time.Duration, *Error) {
	switch {
	case ms == 0:
		return 0, nil
	case limit < time.Millisecond:
		return 0, badRequest("invalid_max_wait", "waiting is disabled on this deployment (ADMIT_MAX_WAIT=0): max_wait_ms must be 0")
	case ms > limit.Milliseconds():
		return 0, badRequest("invalid_max_wait", "max_wait_ms must be at most %d (ADMIT_MAX_WAIT=%s)", limit.Milliseconds(), limit)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// outcomeBody is the body of POST /v1/outcomes.
type outcomeBody struct {
	EventID string                     `json:"event_id"`
	Status  json.RawMessage            `json:"status"`
	Units   map[string]json.RawMessage `json:"units"`
}

func parseOutcome(body io.Reader) (eventID string, status int, units map[policy.Unit]int64, e *Error) {
	var b outcomeBody
	if e := decodeJSON(body, &b); e != nil {
		return "", 0, nil, e
	}
	if b.EventID == "" || len(b.EventID) > 128 {
		return "", 0, nil, badRequest("invalid_event_id", "event_id is required (at most 128 characters)")
	}
	s, err := jsonInt(b.Status)
	if err != nil || s < 100 || s > 599 {
		return "", 0, nil, badRequest("invalid_status", "status must be an HTTP status code, 100-599")
	}
	units, e = decodeUnits(b.Units)
	if e != nil {
		return "", 0, nil, e
	}
	return b.EventID, int(s), units, nil
}

// decodeAdmitFast decodes the body of POST /v1/admit as a calling service usually writes
// it, without reflection and without a second pass for duplicate keys: encoding/json and
// checkDuplicateKeys took most of admit's own CPU per request. It takes one object whose
// members are spelled exactly as admitBody's tags, each at most once, but "estimate":
// api_key, account, idempotency_key and tool strings of printable ASCII without escapes;
// units an object of the four units, each at most once, with integers (JSON's grammar, no
// fraction or exponent); max_wait_ms an integer; JSON whitespace anywhere between tokens,
// nothing after the object. Anything else (an unknown, repeated or differently cased
// member, null, an escape, a fraction, an estimate, ...) returns false, and decodeRaw
// decides as it always did. What it takes decodeRaw decodes the same way (FuzzParseAdmit).
func decodeAdmitFast(raw []byte) (admitBody, bool) {
	d := jsonscan.New(raw)
	var b admitBody
	var seen uint
	ok := d.Object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "api_key":
			bit = 1 << 0
			b.APIKey, ok = d.String()
		case "account":
			bit = 1 << 1
			b.Account, ok = d.String()
		case "idempotency_key":
			bit = 1 << 2
			b.IdempotencyKey, ok = d.String()
		case "tool":
			bit = 1 << 3
			b.Tool, ok = d.String()
		case "units":
			bit = 1 << 4
			b.Units, ok = units(&d)
		case "max_wait_ms":
			bit = 1 << 5
			b.MaxWaitMS, ok = d.Int()
		}
		if bit == 0 || !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	if !ok || !d.End() {
		return admitBody{}, false
	}
	return b, true
}

// units reads an object of the four units' integers, each at most once.
func units(d *jsonscan.Scanner) (map[string]json.RawMessage, bool) {
	u := make(map[string]json.RawMessage, len(policy.Units))
	ok := d.Object(func(name string) bool {
		if _, dup := u[name]; dup || !policy.Unit(name).Valid() {
			return false
		}
		n, ok := d.Int()
		u[name] = n
		return ok
	})
	return u, ok
}
