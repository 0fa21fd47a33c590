package wire

import (
	"strconv"

	"github.com/metergate/metergate/internal/jsonscan"
	"github.com/metergate/metergate/pkg/event"
)

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
	CloudEvent event.CloudEvent
	Admitted   *event.Admitted
	Outcome    *event.Outcome
	Voided     *event.Voided // decoded by encoding/json only: voids are rare
	// Threshold is decoded by encoding/json only: thresholds are rarer still.
	Threshold *event.Threshold
}

// decoder reads a message; the strings it decodes are slices of it.
type decoder struct{ jsonscan.Scanner }

// DecodeFast decodes value, or returns false if value is not in the subset it takes.
func DecodeFast(value []byte) (Decoded, bool) {
	d := decoder{jsonscan.New(value)}
	var out Decoded
	var seen uint
	ok := d.Object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "specversion":
			bit = 1 << 0
			out.CloudEvent.SpecVersion, ok = d.String()
		case "id":
			bit = 1 << 1
			out.CloudEvent.ID, ok = d.String()
		case "source":
			bit = 1 << 2
			out.CloudEvent.Source, ok = d.String()
		case "type":
			bit = 1 << 3
			out.CloudEvent.Type, ok = d.String()
		case "subject":
			bit = 1 << 4
			out.CloudEvent.Subject, ok = d.String()
		case "time":
			bit = 1 << 5
			start := d.Pos()
			if _, ok = d.String(); ok {
				// What encoding/json calls, with the same bytes.
				ok = out.CloudEvent.Time.UnmarshalJSON(d.Since(start)) == nil
			}
		case "datacontenttype":
			bit = 1 << 6
			out.CloudEvent.DataContentType, ok = d.String()
		case "data":
			bit = 1 << 7
			start := d.Pos()
			switch {
			case seen&(1<<3) == 0: // the type is not known yet
			case out.CloudEvent.Type == event.TypeAdmitted:
				out.Admitted, ok = d.admitted()
			case out.CloudEvent.Type == event.TypeOutcome:
				out.Outcome, ok = d.outcome()
			}
			// Any other type (a void) leaves ok false: encoding/json decodes it.
			out.CloudEvent.Data = d.Since(start)
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
	return out, d.End()
}

func (d *decoder) admitted() (*event.Admitted, bool) {
	var a event.Admitted
	var seen uint
	ok := d.Object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "org":
			bit = 1 << 0
			a.Org, ok = d.String()
		case "account":
			bit = 1 << 1
			a.Account, ok = d.String()
		case "path":
			bit = 1 << 2
			a.Path, ok = d.path()
		case "api_key_id":
			bit = 1 << 3
			a.APIKeyID, ok = d.String()
		case "idempotency_key":
			bit = 1 << 4
			a.IdempotencyKey, ok = d.String()
		case "units":
			bit = 1 << 5
			a.Units, ok = d.units()
		case "period":
			bit = 1 << 6
			a.Period, ok = d.String()
		case "plan":
			bit = 1 << 7
			a.Plan, ok = d.String()
		case "tool":
			bit = 1 << 8
			a.Tool, ok = d.String()
		case "fail_open":
			bit = 1 << 9
			a.FailOpen, ok = d.Bool()
		case "borrowed":
			bit = 1 << 10
			a.Borrowed, ok = d.borrowed()
		case "credits":
			bit = 1 << 11
			a.Credits, ok = d.credits()
		case "shadow_refusal":
			bit = 1 << 12
			a.ShadowRefusal, ok = d.String()
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
	return &a, ok
}

func (d *decoder) outcome() (*event.Outcome, bool) {
	var o event.Outcome
	var seen uint
	ok := d.Object(func(key string) bool {
		var bit uint
		var ok bool
		switch key {
		case "event_id":
			bit = 1 << 0
			o.EventID, ok = d.String()
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
func (d *decoder) path() ([]event.PathNode, bool) {
	path := make([]event.PathNode, 0, 4)
	ok := d.Array(func() bool {
		var n event.PathNode
		var seen uint
		ok := d.Object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				n.Account, ok = d.String()
			case "kind":
				bit = 1 << 1
				n.Kind, ok = d.String()
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
func (d *decoder) borrowed() ([]event.Borrowing, bool) {
	out := make([]event.Borrowing, 0, 2)
	ok := d.Array(func() bool {
		var b event.Borrowing
		var seen uint
		ok := d.Object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				b.Account, ok = d.String()
			case "from":
				bit = 1 << 1
				b.From, ok = d.String()
			case "unit":
				bit = 1 << 2
				b.Unit, ok = d.String()
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
func (d *decoder) credits() ([]event.CreditDraw, bool) {
	out := make([]event.CreditDraw, 0, 2)
	ok := d.Array(func() bool {
		var c event.CreditDraw
		var seen uint
		ok := d.Object(func(key string) bool {
			var bit uint
			var ok bool
			switch key {
			case "account":
				bit = 1 << 0
				c.Account, ok = d.String()
			case "unit":
				bit = 1 << 1
				c.Unit, ok = d.String()
			case "grant":
				bit = 1 << 2
				c.Grant, ok = d.String()
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
	ok := d.Object(func(key string) bool {
		if _, dup := u[key]; dup {
			return false
		}
		n, ok := d.int(64)
		u[key] = n
		return ok
	})
	return u, ok
}

// int reads an integer that fits in bits.
func (d *decoder) int(bits int) (int64, bool) {
	text, ok := d.Int()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(text), 10, bits)
	return n, err == nil
}
