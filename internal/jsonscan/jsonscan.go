// Package jsonscan reads the small subset of JSON that metergate's fast decoders take
// without reflection: objects and arrays, strings of printable ASCII without escapes,
// integers as JSON writes them (no fraction, exponent or leading zero), true and false,
// with JSON whitespace between tokens. A reader that meets anything else (null, an
// escape, a fraction, ...) reports false, and its caller falls back on encoding/json, so
// what a Scanner accepts must decode exactly as encoding/json decodes it (the fuzz tests
// of its callers compare the two: internal/meter's and internal/api's).
package jsonscan

// Scanner reads one JSON text; the strings it returns are slices of it, not copies.
type Scanner struct {
	b []byte
	s string // b as a string
	i int
}

// New returns a Scanner at the start of b.
func New(b []byte) Scanner { return Scanner{b: b, s: string(b)} }

// Pos is the offset of the next byte to read.
func (d *Scanner) Pos() int { return d.i }

// Since returns the text read from offset start (a Pos) to here, capped so that an append
// to it copies.
func (d *Scanner) Since(start int) []byte { return d.b[start:d.i:d.i] }

// Space skips JSON whitespace.
func (d *Scanner) Space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// Take skips whitespace, then c if it is next, and reports whether it was.
func (d *Scanner) Take(c byte) bool {
	d.Space()
	if d.i < len(d.s) && d.s[d.i] == c {
		d.i++
		return true
	}
	return false
}

// End reports whether nothing but whitespace is left.
func (d *Scanner) End() bool {
	d.Space()
	return d.i == len(d.s)
}

// String reads a string of printable ASCII without escapes.
func (d *Scanner) String() (string, bool) {
	if !d.Take('"') {
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

// Int reads an integer as JSON writes one and returns its text; a fraction, an exponent
// or a leading zero is left to encoding/json (false).
func (d *Scanner) Int() ([]byte, bool) {
	d.Space()
	start := d.i
	if d.i < len(d.s) && d.s[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.s) && d.s[d.i] == '0':
		d.i++
	case d.i < len(d.s) && d.s[d.i] >= '1' && d.s[d.i] <= '9':
		for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
			d.i++
		}
	default:
		return nil, false
	}
	if d.i < len(d.s) {
		if c := d.s[d.i]; c == '.' || c == 'e' || c == 'E' || c >= '0' && c <= '9' {
			return nil, false
		}
	}
	return d.Since(start), true
}

// Bool reads true or false.
func (d *Scanner) Bool() (v, ok bool) {
	d.Space()
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

// Object reads an object, calling member for each member's key with the Scanner at its
// value (whitespace skipped, so Pos is where the value starts); member reads the value
// and reports whether it could.
func (d *Scanner) Object(member func(key string) bool) bool {
	if !d.Take('{') {
		return false
	}
	if d.Take('}') {
		return true
	}
	for {
		key, ok := d.String()
		if !ok || !d.Take(':') {
			return false
		}
		if d.Space(); !member(key) {
			return false
		}
		if d.Take('}') {
			return true
		}
		if !d.Take(',') {
			return false
		}
	}
}

// Array reads an array, calling elem for each element with the Scanner at it (whitespace
// skipped).
func (d *Scanner) Array(elem func() bool) bool {
	if !d.Take('[') {
		return false
	}
	if d.Take(']') {
		return true
	}
	for {
		if d.Space(); !elem() {
			return false
		}
		if d.Take(']') {
			return true
		}
		if !d.Take(',') {
			return false
		}
	}
}
