package admission

import (
	"crypto/sha256"
	"encoding/base64"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

// encoded is one script call: its keys and arguments, and how to read each decision's
// reply.
type encoded struct {
	keys  []string
	args  []any
	plans []*plan
}

// plan is what one decision checks, in the order the script reports it.
type plan struct {
	req Request
	// rates are the token buckets (the first buckets of them), then the sliding windows.
	rates   []check
	buckets int
	order   []int // the place of each bucket's state in Decision.Limits
	quotas  []check
	concs   []policy.Level
	credits []creditCheck
	alerts  []alertRecord
	nexts   []byte // the decision's nexts argument
}

// alertRecord is one alert rule's thresholds a decision may fire: the script's alert record.
type alertRecord struct {
	*alertArgs
	ref  int   // i > 0: the decision's quota i; i < 0: its credit record -i
	next int64 // the script looks at the thresholds when the counter reaches it, or the balance falls below it
}

type creditCheck struct {
	*creditArgs
	amount int64
}

type check struct {
	*limitArgs // the level, unit and limit, with their keys and constant arguments
	amount     int64
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// The admission script's arguments (lua/admit.lua): a call header, then per decision a
// header (and a wait record when the request may wait). What a decision checks is the
// account's program (limits.go), which the script reads from the org's mirror in Redis.
// Each block's constants are its fields' positions; the names beside them are the
// script's locals for the fields, and TestScriptLayout requires the script to read the
// same names in the same order ("-- layout: call", "decision", "wait"; the program's
// blocks are in limits.go).
const (
	argDecisions = iota
	argLo
	argHi
	argMonthNext
	argMonthLabel
	argMonthNextLabel
	argMonthExpiry
	argMonthNextExpiry
	argDayNext
	argDayLabel
	argDayNextLabel
	argDayExpiry
	argDayNextExpiry
	argTag
	argLeaseTTL
	argIdemHot    // the hot window H, ms
	argIdemTTL    // the idempotency TTL, ms
	argIdemLegacy // the bucket width of the layout before hot buckets, ms ("": not looked up)
	argQueueChannel
	callLen
)

const (
	decEventID = iota
	decProgram // the program's field in the mirror: its version, then the account
	decInline  // the program itself when the mirror may not hold it, else ""
	decIdem
	decFingerprint
	decRequests // the units, one field each (policy.Units order)
	decTokens
	decCredits
	decCostMicros
	decEvent // the compact usage event up to the policy's fields (the program has those)
	decFlags // shadow, replay, wait, logged: "0" or "1" each
	decNexts // per alert rule of the program: where the script looks at its thresholds, -1 not at all
	decBloom // the positions of the key in the idempotency filters, "" without a billing log
	decisionLen
)

const (
	waitMS     = iota // ms the request may still wait
	waitTicket        // the request's ticket
	waitMember        // its member in the queue tq, "" when in none
	waitQueue
	waitLen
)

// argNames are the script's names of each block's fields, by position.
var argNames = map[string][]string{
	"call": (&[callLen]string{
		argDecisions: "decisions", argLo: "lo", argHi: "hi", argMonthNext: "m_next",
		argMonthLabel: "m_label", argMonthNextLabel: "m_next_label",
		argMonthExpiry: "m_expiry", argMonthNextExpiry: "m_next_expiry",
		argDayNext: "d_next", argDayLabel: "d_label", argDayNextLabel: "d_next_label",
		argDayExpiry: "d_expiry", argDayNextExpiry: "d_next_expiry", argTag: "tag",
		argLeaseTTL: "lease_ttl", argIdemHot: "idem_h", argIdemTTL: "idem_ttl", argIdemLegacy: "idem_legacy",
		argQueueChannel: "qchan",
	})[:],
	"decision": (&[decisionLen]string{
		decEventID: "event_id", decProgram: "pfield", decInline: "inline", decIdem: "idem", decFingerprint: "fingerprint",
		decRequests: "u_r", decTokens: "u_t", decCredits: "u_c", decCostMicros: "u_m", decEvent: "ev",
		decFlags: "flags", decNexts: "nexts", decBloom: "bloom",
	})[:],
	"wait": (&[waitLen]string{waitMS: "w", waitTicket: "t", waitMember: "m", waitQueue: "q"})[:],
}

func (a *Admitter) encode(shard int, batch []*call, now time.Time) encoded {
	ref := now.Add(-skew)
	mCur := period.MonthStart(ref)
	mNext, mEnd := mCur.AddDate(0, 1, 0), mCur.AddDate(0, 2, 0)
	dCur := period.DayStart(ref)
	dNext, dEnd := dCur.AddDate(0, 0, 1), dCur.AddDate(0, 0, 2)
	keep := a.opts.QuotaRetention
	args := make([]any, 0, callLen+(decisionLen+waitLen)*len(batch))
	var h [callLen]any
	h[argDecisions] = strconv.Itoa(len(batch))
	// The day's bounds lie within the month's: TIME within them is within both.
	h[argLo], h[argHi] = ms(dCur), ms(dEnd)
	h[argMonthNext] = ms(mNext)
	h[argMonthLabel], h[argMonthNextLabel] = period.MonthLabel(mCur), period.MonthLabel(mNext)
	h[argMonthExpiry], h[argMonthNextExpiry] = ms(mNext.Add(keep)), ms(mEnd.Add(keep))
	h[argDayNext] = ms(dNext)
	h[argDayLabel], h[argDayNextLabel] = period.DayLabel(dCur), period.DayLabel(dNext)
	h[argDayExpiry], h[argDayNextExpiry] = ms(dNext.Add(keep)), ms(dEnd.Add(keep))
	h[argTag], h[argLeaseTTL] = a.keys.Tag(shard), a.leaseTTL
	h[argIdemHot], h[argIdemTTL], h[argIdemLegacy] = a.idemHot, a.idemTTL, a.idemLegacy
	h[argQueueChannel] = a.keys.QueueChannel()
	e := encoded{
		keys:  make([]string, 1, 1+len(batch)),
		args:  append(args, h[:]...),
		plans: make([]*plan, len(batch)),
	}
	e.keys[0] = a.keys.Outbox(shard)
	var per periods
	if late := now.Add(skew); period.MonthLabel(ref) == period.MonthLabel(late) {
		per.month = period.MonthLabel(late)
		if period.DayLabel(ref) == period.DayLabel(late) {
			per.day = period.DayLabel(late)
		}
	}
	for i, c := range batch {
		e.plans[i] = a.encodeOne(&e, shard, c, per, now)
	}
	return e
}

// periods are the labels of the month and the day of an encoding, each "" when the script
// may charge another one (Redis TIME may be up to skew away).
type periods struct{ month, day string }

// plan returns what r's decision checks under lim: the limits its units touch, in the
// order the script reports them.
func (lim *limits) plan(r Request, per periods) *plan {
	p := &plan{req: r, rates: make([]check, 0, len(lim.checks))}
	for i := range lim.buckets {
		c := &lim.buckets[i]
		if amount := r.Units[c.unit]; amount != 0 {
			p.rates = append(p.rates, check{limitArgs: c, amount: amount})
		}
	}
	p.buckets = len(p.rates)
	p.order = make([]int, p.buckets)
	for i := range p.order {
		for _, c := range p.rates[:p.buckets] {
			if c.index < p.rates[i].index {
				p.order[i]++
			}
		}
	}
	for i := range lim.checks {
		c := &lim.checks[i]
		amount := r.Units[c.unit]
		if amount == 0 {
			continue // nothing to consume, nothing that could deny
		}
		if c.windowKey != "" {
			p.rates = append(p.rates, check{limitArgs: c, amount: amount})
		}
		if c.quotaKey != "" {
			p.quotas = append(p.quotas, check{limitArgs: c, amount: amount})
		}
	}
	p.concs = lim.concs
	for i := range lim.credits {
		c := &lim.credits[i]
		if amount := r.Units[c.unit]; amount > 0 {
			p.credits = append(p.credits, creditCheck{creditArgs: c, amount: amount})
		}
	}
	if len(lim.alerts) > 0 {
		p.nexts = make([]byte, 0, 8*len(lim.alerts))
		for i, al := range lim.alerts {
			if i > 0 {
				p.nexts = append(p.nexts, ',')
			}
			rec, ok := al.record(p, per)
			if !ok {
				p.nexts = append(p.nexts, "-1"...)
				continue
			}
			p.alerts = append(p.alerts, rec)
			p.nexts = strconv.AppendInt(p.nexts, rec.next, 10)
		}
	}
	return p
}

func (a *Admitter) encodeOne(e *encoded, shard int, c *call, per periods, now time.Time) *plan {
	r := c.req
	lim := a.limitsOf(shard, r.Policy)
	p := lim.plan(r, per)
	e.keys = append(e.keys, lim.state)
	var d [decisionLen]any
	d[decEventID], d[decProgram], d[decInline] = r.EventID, lim.field, ""
	if c.inline || lim.sendInline(now) {
		d[decInline] = lim.program
	}
	d[decIdem], d[decFingerprint], d[decBloom] = "", "", ""
	if r.IdempotencyKey != "" {
		sum := keyspace.IdempotencyHash(r.Policy.Account(), r.IdempotencyKey)
		d[decIdem], d[decFingerprint] = string(sum[:16]), shortFingerprint(fingerprint(r.Units, r.Tool))
		if a.opts.IdempotencyLog != nil {
			d[decBloom] = a.bloom(sum)
		}
	}
	d[decRequests], d[decTokens] = amount(r.Units[policy.Requests]), amount(r.Units[policy.Tokens])
	d[decCredits], d[decCostMicros] = amount(r.Units[policy.Credits]), amount(r.Units[policy.CostMicros])
	d[decEvent] = compactEvent(r)
	flags := [4]byte{'0', '1', '0', '0'}
	if r.Shadow {
		flags[0] = '1'
	}
	if r.RefuseReplay {
		flags[1] = '0'
	}
	if c.wait != nil {
		flags[2] = '1'
	}
	if c.logged {
		flags[3] = '1'
	}
	d[decFlags], d[decNexts] = string(flags[:]), string(p.nexts)
	e.args = append(e.args, d[:]...)
	if w := c.wait; w != nil {
		var rec [waitLen]any
		rec[waitMS], rec[waitTicket], rec[waitMember], rec[waitQueue] = strconv.FormatInt(w.left(), 10), w.ticket, w.member, w.queue
		e.args = append(e.args, rec[:]...)
	}
	return p
}

// amount is a unit's amount as the script takes it.
func amount(n int64) string {
	if n >= 0 && n < int64(len(smallAmounts)) {
		return smallAmounts[n]
	}
	return strconv.FormatInt(n, 10)
}

// smallAmounts are the amounts most requests carry, formatted once.
var smallAmounts = func() (s [1024]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

// bloomPositions is how many bits of a filter stand for one key (k): with about 9.6 bits
// per key, 7 give the fewest false positives, about 1 %.
const bloomPositions = 7

// bloom returns the positions of a key's bits in the idempotency filters, from the hash of
// its account and key: "<p1> <p2> …".
func (a *Admitter) bloom(sum [sha256.Size]byte) string {
	b := make([]byte, 0, bloomPositions*10)
	for i := range bloomPositions {
		if i > 0 {
			b = append(b, ' ')
		}
		v := uint64(sum[4*i])<<24 | uint64(sum[4*i+1])<<16 | uint64(sum[4*i+2])<<8 | uint64(sum[4*i+3])
		b = strconv.AppendUint(b, v%a.filterBits, 10)
	}
	return string(b)
}

// fingerprint identifies a request's units and tool, to tell a retry from a reuse of its
// idempotency key: "requests=1,tokens=2500;llm_call".
func fingerprint(units map[policy.Unit]int64, tool string) string {
	parts := make([]string, 0, len(units))
	for u, v := range units {
		parts = append(parts, string(u)+"="+strconv.FormatInt(v, 10))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",") + ";" + tool
}

// shortFingerprint is what an idempotency record keeps of a fingerprint: 72 bits of its
// SHA-256, 12 characters (a retry with other units or tool is told apart but for a chance
// of 2^-72).
func shortFingerprint(fp string) string {
	h := sha256.Sum256([]byte(fp))
	return base64.RawURLEncoding.EncodeToString(h[:9])
}
