package security_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/metergate/metergate/internal/api"
)

// Finding 13: the check's headers, fuzzed.
func fuzzProbes() []probe {
	return []probe{
		{name: "F13-check-fuzz", desc: fmt.Sprintf("%d GET /v1/check with fuzzed headers (seeded): only 200/400/401/402/403/409/422/429 or 503 unavailable, every 200 a new event id, no other account's id", pick(500, 20000)),
			run: fuzzCheck},
	}
}

// fuzzStatuses are the answers the check may give to any headers.
var fuzzStatuses = []int{200, 400, 401, 402, 403, 409, 422, 429}

// fuzzRequest is one generated check.
type fuzzRequest struct {
	method string
	header [][2]string
}

func (r fuzzRequest) String() string {
	var b strings.Builder
	b.WriteString(r.method)
	for _, h := range r.header {
		v := h[1]
		if len(v) > 60 {
			v = fmt.Sprintf("%s…(%d bytes)", v[:60], len(v))
		}
		fmt.Fprintf(&b, " %s=%q", h[0], v)
	}
	return b.String()
}

// fuzzer generates checks from a seeded source, so a failure reproduces.
type fuzzer struct {
	rng  *rand.Rand
	key  string   // the fuzzed account's API key
	idem []string // a small pool of idempotency keys, so that keys repeat
}

func (f *fuzzer) pick(xs ...string) string { return xs[f.rng.IntN(len(xs))] }

// name is a header name in some casing: canonical, lower, upper or mixed.
func (f *fuzzer) name(n string) string {
	switch f.rng.IntN(5) {
	case 0:
		return strings.ToLower(n)
	case 1:
		return strings.ToUpper(n)
	case 2:
		b := []byte(n)
		for i := range b {
			if f.rng.IntN(2) == 0 {
				b[i] = strings.ToUpper(string(b[i]))[0]
			} else {
				b[i] = strings.ToLower(string(b[i]))[0]
			}
		}
		return string(b)
	default:
		return n
	}
}

// text is a hostile string: long, unicode, spaces, quotes, separators.
func (f *fuzzer) text() string {
	switch f.rng.IntN(8) {
	case 0:
		return strings.Repeat(f.pick("a", "9", "é", "{", "%"), 1+f.rng.IntN(4000))
	case 1:
		return "ключ-" + fmt.Sprint(f.rng.IntN(100))
	case 2:
		return "a b\tc"
	case 3:
		return `"quoted";r=1;t=2`
	case 4:
		return "../../etc/passwd"
	case 5:
		return "{1}:i:0"
	case 6:
		return "\u202eevil\u200b" // a right-to-left override and a zero-width space
	default:
		return fmt.Sprintf("k%x", f.rng.Uint64())
	}
}

// number is a hostile number: huge, negative, float, unicode digits, padded, hex.
func (f *fuzzer) number() string {
	switch f.rng.IntN(4) {
	case 0:
		return fmt.Sprint(f.rng.IntN(1_000_000))
	case 1:
		return strings.Repeat("9", 1+f.rng.IntN(1000))
	default:
		return f.pick("0", "-0", "-1", "+5", "1.5", "1e3", "1E15", " 12", "12 ", "0x10", "NaN", "Infinity", "٣", "１２",
			"9223372036854775807", "9223372036854775808", "18446744073709551616", "1000000000000000", "1000000000000001",
			"4611686018427387904", "9007199254740993", "", "12,13")
	}
}

func (f *fuzzer) next() fuzzRequest {
	r := fuzzRequest{method: f.pick("GET", "GET", "GET", "POST", "PUT", "DELETE")}
	add := func(name, value string) { r.header = append(r.header, [2]string{f.name(name), value}) }
	switch f.rng.IntN(20) {
	case 0: // no service token
	case 1:
		add("X-Metergate-Token", f.text())
	default:
		r.header = append(r.header, [2]string{"X-Metergate-Token", serviceToken})
	}
	switch n := f.rng.IntN(10); {
	case n < 6:
		add("X-Api-Key", f.key)
	case n == 6:
		add("X-Api-Key", f.key)
		add("X-Api-Key", "mgk_"+f.text()) // repeated
	case n == 7:
		add("X-Api-Key", "mgk_"+f.text())
	case n == 8:
		add("X-Api-Key", f.key+f.pick(" ", "x", "\t"))
	}
	for _, h := range []struct {
		name  string
		p     int // in 10
		value func() string
	}{
		{"X-Estimated-Tokens", 6, f.number},
		{"X-Tool", 4, func() string {
			return f.pick("web_search", "llm_call", "code_execute", "image_generate", "unknown", "WEB_SEARCH", f.text())
		}},
		{"Idempotency-Key", 5, func() string {
			if f.rng.IntN(3) == 0 {
				return f.text()
			}
			return f.idem[f.rng.IntN(len(f.idem))]
		}},
		{"X-Account", 2, f.text},
		{"X-Metergate-Event-Id", 1, func() string { return "forged-event" }},
		{"X-Metergate-Account", 1, f.text},
	} {
		if f.rng.IntN(10) < h.p {
			add(h.name, h.value())
			if f.rng.IntN(8) == 0 {
				add(h.name, h.value()) // repeated
			}
		}
	}
	f.rng.Shuffle(len(r.header), func(i, j int) { r.header[i], r.header[j] = r.header[j], r.header[i] })
	return r
}

func fuzzCheck(p *P, s *stack) {
	sd := seed(p.T)
	p.Logf("seed %d (METERGATE_SECURITY_SEED=%d replays this run)", sd, sd)
	own, other := s.id("fuzz"), s.id("fuzzother")
	s.org(p, own, "enterprise", nil)
	s.org(p, other, "pro", nil)
	key := s.apiKey(p, own)
	_ = s.apiKey(p, other) // an account with a key of its own that no answer may name

	f := &fuzzer{rng: rand.New(rand.NewPCG(uint64(sd), 0x5ec)), key: key}
	for i := range 20 {
		f.idem = append(f.idem, fmt.Sprintf("fz-%d", i))
	}
	n := pick(500, 20000)
	reqs := make([]fuzzRequest, n)
	for i := range reqs {
		reqs[i] = f.next()
	}

	var (
		mu         sync.Mutex
		events     = map[string]int{} // event id → the request that got it
		violations []string
		statuses   = map[int]int{}
		unsent     int // requests the client itself refuses to send (a header value it rejects)
	)
	violate := func(i int, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		violations = append(violations, fmt.Sprintf("request %d %s: %s", i, reqs[i], fmt.Sprintf(format, args...)))
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				a, err := send(p.Context(), reqs[i].method, s.admit+"/v1/check", reqs[i].header, nil)
				if err != nil {
					if strings.Contains(err.Error(), "invalid header") {
						mu.Lock()
						unsent++
						mu.Unlock()
						continue
					}
					violate(i, "no answer: %v", err)
					continue
				}
				mu.Lock()
				statuses[a.status]++
				mu.Unlock()
				switch {
				case slices.Contains(fuzzStatuses, a.status):
				case a.status == http.StatusServiceUnavailable && a.code() == "unavailable":
				default:
					violate(i, "answered %d %s", a.status, strings.TrimSpace(a.body))
				}
				if strings.Contains(a.String(), other) {
					violate(i, "the answer names the other account %s:\n%s", other, a)
				}
				if a.status == http.StatusOK {
					id := a.header.Get(api.EventIDHeader)
					mu.Lock()
					first, seen := events[id]
					if !seen {
						events[id] = i
					}
					mu.Unlock()
					switch {
					case id == "":
						violate(i, "a 200 without %s", api.EventIDHeader)
					case seen:
						violate(i, "a 200 with event %s, already given to request %d: one event served twice", id, first)
					}
				}
			}
		})
	}
	for i := range reqs {
		next <- i
	}
	close(next)
	wg.Wait()
	p.Logf("%d checks: answers %v, %d not sent (the client refused a header), %d events", n, statuses, unsent, len(events))
	if len(violations) > 10 {
		violations = append(violations[:10], fmt.Sprintf("… and %d more", len(violations)-10))
	}
	none(p, violations, "seed %d: the check broke its invariants", sd)
}
