package event

import "strconv"

// A message's JSON is decoded without reflection when it is written the way the relay
// writes it (OutboxMessage, or json.Marshal of CloudEvent): encoding/json took most of the
// meter's CPU time. The fast decoder takes a subset of JSON: strings of printable ASCII
// without escapes, integers without fraction or exponent, true and false, the members of
// each object spelled exactly as in this package and each at most once, and "type" before
// "data". Anything else (null, an escape, an unknown or repeated member, ...) makes it give
// up, and the meter falls back on encoding/json. What it accepts it decodes exactly as
// encoding/json does (internal/meter's FuzzDecode).

// Decoded is a message decoded: the envelope, and the data of a known type.
type Decoded struct {
	CloudEvent CloudEvent
	Admitted   *Admitted
	Outcome    *Outcome
	Voided     *Voided // decoded by encoding/json only: voids are rare
	// Threshold is decoded by encoding/json only: thresholds are rarer still.
	Threshold *Threshold
}

// decoder reads a message; the strings it decodes are slices of s.
type decoder struct {
	b []byte
	s string // b as a string
	i int
}

// DecodeFast decodes value, or returns false if value is not in the subset it takes.
func DecodeFast(value []byte) (Decoded, bool) {
	d := decoder{b: value, s: string(value)}
	var out Decoded
	var seen uint
	ok := d.object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "specversion":
			bit = 1 << 0
			out.CloudEvent.SpecVersion, ok = d.str()
		case "id":
			bit = 1 << 1
			out.CloudEvent.ID, ok = d.str()
		case "source":
			bit = 1 << 2
			out.CloudEvent.Source, ok = d.str()
		case "type":
			bit = 1 << 3
			out.CloudEvent.Type, ok = d.str()
		case "subject":
			bit = 1 << 4
			out.CloudEvent.Subject, ok = d.str()
		case "time":
			bit = 1 << 5
			start := d.i
			if _, ok = d.str(); ok {
				// What encoding/json calls, with the same bytes.
				ok = out.CloudEvent.Time.UnmarshalJSON(d.b[start:d.i]) == nil
			}
		case "datacontenttype":
			bit = 1 << 6
			out.CloudEvent.DataContentType, ok = d.str()
		case "data":
			bit = 1 << 7
			start := d.i
			switch {
			case seen&(1<<3) == 0: // the type is not known yet
			case out.CloudEvent.Type == TypeAdmitted:
				out.Admitted, ok = d.admitted()
			case out.CloudEvent.Type == TypeOutcome:
				out.Outcome, ok = d.outcome()
			}
			// Any other type (a void) leaves ok false: encoding/json decodes it.
			out.CloudEvent.Data = d.b[start:d.i:d.i]
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	if !ok {
		return Decoded{}, false
	}
	d.space()
	return out, d.i == len(d.s)
}

func (d *decoder) admitted() (*Admitted, bool) {
	var a Admitted
	var seen uint
	ok := d.object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "org":
			bit = 1 << 0
			a.Org, ok = d.str()
		case "account":
			bit = 1 << 1
			a.Account, ok = d.str()
		case "path":
			bit = 1 << 2
			a.Path, ok = d.path()
		case "api_key_id":
			bit = 1 << 3
			a.APIKeyID, ok = d.str()
		case "idempotency_key":
			bit = 1 << 4
			a.IdempotencyKey, ok = d.str()
		case "units":
			bit = 1 << 5
			a.Units, ok = d.units()
		case "period":
			bit = 1 << 6
			a.Period, ok = d.str()
		case "plan":
			bit = 1 << 7
			a.Plan, ok = d.str()
		case "tool":
			bit = 1 << 8
			a.Tool, ok = d.str()
		case "fail_open":
			bit = 1 << 9
			a.FailOpen, ok = d.bool()
		case "borrowed":
			bit = 1 << 10
			a.Borrowed, ok = d.borrowed()
		case "credits":
			bit = 1 << 11
			a.Credits, ok = d.credits()
		case "shadow_refusal":
			bit = 1 << 12
			a.ShadowRefusal, ok = d.str()
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	return &a, ok
}

func (d *decoder) outcome() (*Outcome, bool) {
	var o Outcome
	var seen uint
	ok := d.object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "event_id":
			bit = 1 << 0
			o.EventID, ok = d.str()
		case "status":
			bit = 1 << 1
			var n int64
			n, ok = d.int(strconv.IntSize)
			o.Status = int(n)
		case "units":
			bit = 1 << 2
			o.Units, ok = d.units()
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	return &o, ok
}

// path decodes an array of path nodes; [] is an empty slice, as encoding/json makes it.
func (d *decoder) path() ([]PathNode, bool) {
	path := make([]PathNode, 0, 4)
	ok := d.array(func() bool {
		var n PathNode
		var seen uint
		ok := d.object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				n.Account, ok = d.str()
			case "kind":
				bit = 1 << 1
				n.Kind, ok = d.str()
			}
			if !ok || seen&bit != 0 {
				return false
			}
			seen |= bit
			return true
		})
		path = append(path, n)
		return ok
	})
	if !ok {
		return nil, false
	}
	return path, true
}

// borrowed decodes an array of borrowings; [] is an empty slice, as encoding/json makes it.
func (d *decoder) borrowed() ([]Borrowing, bool) {
	out := make([]Borrowing, 0, 2)
	ok := d.array(func() bool {
		var b Borrowing
		var seen uint
		ok := d.object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				b.Account, ok = d.str()
			case "from":
				bit = 1 << 1
				b.From, ok = d.str()
			case "unit":
				bit = 1 << 2
				b.Unit, ok = d.str()
			case "units":
				bit = 1 << 3
				b.Units, ok = d.int(64)
			}
			if !ok || seen&bit != 0 {
				return false
			}
			seen |= bit
			return true
		})
		out = append(out, b)
		return ok
	})
	if !ok {
		return nil, false
	}
	return out, true
}

// credits decodes an array of credit draws; [] is an empty slice, as encoding/json makes it.
func (d *decoder) credits() ([]CreditDraw, bool) {
	out := make([]CreditDraw, 0, 2)
	ok := d.array(func() bool {
		var c CreditDraw
		var seen uint
		ok := d.object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				c.Account, ok = d.str()
			case "unit":
				bit = 1 << 1
				c.Unit, ok = d.str()
			case "grant":
				bit = 1 << 2
				c.Grant, ok = d.str()
			case "units":
				bit = 1 << 3
				c.Units, ok = d.int(64)
			}
			if !ok || seen&bit != 0 {
				return false
			}
			seen |= bit
			return true
		})
		out = append(out, c)
		return ok
	})
	if !ok {
		return nil, false
	}
	return out, true
}

// units decodes an object of integers; {} is an empty map, as encoding/json makes it.
func (d *decoder) units() (map[string]int64, bool) {
	u := make(map[string]int64, 4)
	ok := d.object(func(key string) bool {
		if _, dup := u[key]; dup {
			return false
		}
		n, ok := d.int(64)
		u[key] = n
		return ok
	})
	return u, ok
}

// array reads an array, calling elem for each element with the decoder at it.
func (d *decoder) array(elem func() bool) bool {
	if !d.take('[') {
		return false
	}
	d.space()
	if d.take(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		d.space()
		if d.take(']') {
			return true
		}
		if !d.take(',') {
			return false
		}
		d.space()
	}
}

// object reads an object, calling member for each member with the decoder at the value.
func (d *decoder) object(member func(key string) bool) bool {
	d.space()
	if !d.take('{') {
		return false
	}
	d.space()
	if d.take('}') {
		return true
	}
	for {
		key, ok := d.str()
		if !ok {
			return false
		}
		d.space()
		if !d.take(':') {
			return false
		}
		d.space()
		if !member(key) {
			return false
		}
		d.space()
		if d.take('}') {
			return true
		}
		if !d.take(',') {
			return false
		}
		d.space()
	}
}

// str reads a string of printable ASCII without escapes.
func (d *decoder) str() (string, bool) {
	if !d.take('"') {
		return "", false
	}
	start := d.i
	for ; d.i < len(d.s); d.i++ {
		switch c := d.s[d.i]; {
		case c == '"':
			d.i++
			return d.s[start : d.i-1], true
		case c < ' ' || c > '~' || c == '\\':
			return "", false
		}
	}
	return "", false
}

// int reads an integer (JSON's grammar, no fraction or exponent) that fits in bits.
func (d *decoder) int(bits int) (int64, bool) {
	start := d.i
	d.take('-')
	switch {
	case d.take('0'):
	case d.i < len(d.s) && d.s[d.i] >= '1' && d.s[d.i] <= '9':
		for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
			d.i++
		}
	default:
		return 0, false
	}
	n, err := strconv.ParseInt(d.s[start:d.i], 10, bits)
	return n, err == nil
}

func (d *decoder) bool() (bool, bool) {
	switch {
	case len(d.s)-d.i >= 4 && d.s[d.i:d.i+4] == "true":
		d.i += 4
		return true, true
	case len(d.s)-d.i >= 5 && d.s[d.i:d.i+5] == "false":
		d.i += 5
		return false, true
	}
	return false, false
}

func (d *decoder) take(c byte) bool {
	if d.i < len(d.s) && d.s[d.i] == c {
		d.i++
		return true
	}
	return false
}

// space skips JSON whitespace.
func (d *decoder) space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}
