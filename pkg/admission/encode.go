package admission

import (
	"crypto/sha256"
	"encoding/base64"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/pkg/period"
	"github.com/metergate/metergate/pkg/policy"
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
// header and one record per token bucket, sliding window, quota and concurrency limit.
// Each block's constants are its fields' positions; the names beside them are the
// script's locals for the fields, and TestScriptLayout requires the script to read the
// same names in the same order ("-- layout: call", "decision", "bucket", "window",
// "quota", "conc").
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
	argIdemW
	argQueueChannel
	callLen
)

const (
	decEventID = iota
	decIdem
	decLegacy
	decLegacyFP
	decFingerprint
	decIDTail
	decBuckets
	decWindows
	decQuotas
	decConcs
	decEvent
	decPriority
	decTiers
	decWait
	decCredits
	decAlerts
	decShadow // "1": shadow mode (Request.Shadow)
	decReplay // "1": a replay is answered; "0": refused (Request.RefuseReplay)
	decisionLen
)

const (
	bucketField = iota
	bucketInc   // amount × emission interval, µs
	bucketWin   // burst × emission interval, µs
	bucketLen
)

const (
	tierUp           = iota // 0 the chain's last, 1 the level above follows, 2 and reserves for this one
	tierCeilingField        // "" when the level has no ceiling
	tierCeilingInc
	tierCeilingWin
	tierBorrow // "<account>:<unit>=<amount>"
	tierLen
)

const (
	waitMS     = iota // ms the request may still wait
	waitTicket        // the request's ticket
	waitMember        // its member in the queue tq, "" when in none
	waitQueue
	waitLen
)

const (
	creditGrants = iota // Keys.Grants
	creditTerms         // Keys.GrantTerms
	creditAmount
	creditLabel // "<account>:<unit>"
	creditLen
)

const (
	alertRef   = iota // i > 0: the decision's quota record i; i < 0: its credit record -i
	alertNext         // units: a quota counter reaching it, a balance falling below it
	alertList         // the thresholds: "<units>:<spec>,…" ascending (spec: policy.Alert.Spec)
	alertLabel        // "<account>:<unit>"
	alertLen
)

const (
	windowKey = iota
	windowAmount
	windowWidth // ms
	windowLimit
	windowLen
)

const (
	quotaPrefix = iota
	quotaAmount
	quotaCap
	quotaKind
	quotaLen
)

const (
	concKey = iota
	concCap
	concLen
)

// argNames are the script's names of each block's fields, by position.
var argNames = map[string][]string{
	"call": (&[callLen]string{
		argDecisions: "decisions", argLo: "lo", argHi: "hi", argMonthNext: "m_next",
		argMonthLabel: "m_label", argMonthNextLabel: "m_next_label",
		argMonthExpiry: "m_expiry", argMonthNextExpiry: "m_next_expiry",
		argDayNext: "d_next", argDayLabel: "d_label", argDayNextLabel: "d_next_label",
		argDayExpiry: "d_expiry", argDayNextExpiry: "d_next_expiry", argTag: "tag",
		argLeaseTTL: "lease_ttl", argIdemW: "idem_w", argQueueChannel: "qchan",
	})[:],
	"decision": (&[decisionLen]string{
		decEventID: "event_id", decIdem: "idem", decLegacy: "legacy", decLegacyFP: "legacy_fp",
		decFingerprint: "fingerprint", decIDTail: "id_tail", decBuckets: "n_bucket", decWindows: "n_window", decQuotas: "n_quota", decConcs: "n_conc", decEvent: "ev",
		decPriority: "prio", decTiers: "n_tier", decWait: "n_wait", decCredits: "n_credit", decAlerts: "n_alert", decShadow: "shadow", decReplay: "replay",
	})[:],
	"credit": (&[creditLen]string{creditGrants: "gkey", creditTerms: "tkey", creditAmount: "amount", creditLabel: "label"})[:],
	"alert":  (&[alertLen]string{alertRef: "ref", alertNext: "next", alertList: "list", alertLabel: "label"})[:],
	"bucket": (&[bucketLen]string{bucketField: "field", bucketInc: "inc", bucketWin: "win"})[:],
	"tier":   (&[tierLen]string{tierUp: "up", tierCeilingField: "cfield", tierCeilingInc: "cinc", tierCeilingWin: "cwin", tierBorrow: "borrow"})[:],
	"wait":   (&[waitLen]string{waitMS: "w", waitTicket: "t", waitMember: "m", waitQueue: "q"})[:],
	"window": (&[windowLen]string{windowKey: "key", windowAmount: "amount", windowWidth: "width", windowLimit: "limit"})[:],
	"quota":  (&[quotaLen]string{quotaPrefix: "prefix", quotaAmount: "amount", quotaCap: "quota", quotaKind: "kind"})[:],
	"conc":   (&[concLen]string{concKey: "key", concCap: "cap"})[:],
}

func (a *Admitter) encode(shard int, batch []*call, now time.Time) encoded {
	ref := now.Add(-skew)
	mCur := period.MonthStart(ref)
	mNext, mEnd := mCur.AddDate(0, 1, 0), mCur.AddDate(0, 2, 0)
	dCur := period.DayStart(ref)
	dNext, dEnd := dCur.AddDate(0, 0, 1), dCur.AddDate(0, 0, 2)
	keep := a.opts.QuotaRetention
	levels := 0
	for _, c := range batch {
		levels += len(c.req.Policy.Path)
	}
	// Room for two units' buckets and quotas per level, so appends rarely grow.
	args := make([]any, 0, callLen+decisionLen*len(batch)+14*levels)
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
	h[argTag], h[argLeaseTTL], h[argIdemW] = a.keys.tag(shard), a.leaseTTL, a.idemW
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
		e.plans[i] = a.encodeOne(&e, shard, c.req, c.wait, per)
	}
	return e
}

// maxMicros bounds a bucket's inc and win (about 31 years), so that a TAT stays an exact
// integer in Lua's doubles.
const maxMicros = 1e15

// periods are the labels of the month and the day of an encoding, each "" when the script
// may charge another one (Redis TIME may be up to skew away).
type periods struct{ month, day string }

func (a *Admitter) encodeOne(e *encoded, shard int, r Request, w *waiting, per periods) *plan {
	pol := r.Policy
	lim := a.limitsOf(shard, pol)
	p := &plan{req: r, rates: make([]check, 0, len(lim.checks))}
	windows, tiered := 0, false
	for i := range lim.buckets {
		c := &lim.buckets[i]
		if amount := r.Units[c.unit]; amount != 0 {
			p.rates = append(p.rates, check{limitArgs: c, amount: amount})
			tiered = tiered || lim.tiered[c.unit]
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
			windows++
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
	for _, al := range lim.alerts {
		if rec, ok := al.record(p, per); ok {
			p.alerts = append(p.alerts, rec)
		}
	}

	e.keys = append(e.keys, lim.state)
	var d [decisionLen]any
	d[decEventID], d[decIdem], d[decLegacy], d[decLegacyFP], d[decFingerprint] = r.EventID, "", "", "", ""
	if r.IdempotencyKey != "" {
		fp := fingerprint(r.Units, r.Tool)
		d[decIdem], d[decFingerprint] = idempotencyField(pol.Account(), r.IdempotencyKey), shortFingerprint(fp)
		if a.opts.IdempotencyLegacy {
			d[decLegacy], d[decLegacyFP] = a.keys.idempotency(shard, pol.Account(), r.IdempotencyKey), fp
		}
	}
	d[decIDTail] = lim.idTail
	d[decBuckets], d[decWindows] = strconv.Itoa(p.buckets), strconv.Itoa(windows)
	d[decQuotas], d[decConcs] = strconv.Itoa(len(p.quotas)), strconv.Itoa(len(p.concs))
	d[decEvent] = compactEvent(r, &lim.event)
	d[decPriority], d[decTiers], d[decWait] = strconv.Itoa(pol.Priority), "0", "0"
	if tiered {
		d[decTiers] = strconv.Itoa(p.buckets)
	}
	if w != nil {
		d[decWait] = "1"
	}
	d[decCredits], d[decAlerts] = strconv.Itoa(len(p.credits)), strconv.Itoa(len(p.alerts))
	d[decShadow], d[decReplay] = "0", "1"
	if r.Shadow {
		d[decShadow] = "1"
	}
	if r.RefuseReplay {
		d[decReplay] = "0"
	}
	e.args = append(e.args, d[:]...)
	for _, c := range p.rates[:p.buckets] {
		var rec [bucketLen]any
		rec[bucketField], rec[bucketWin] = c.field, c.win
		rec[bucketInc] = micros(c.amount, c.emission)
		e.args = append(e.args, rec[:]...)
	}
	if tiered {
		for _, c := range p.rates[:p.buckets] {
			var rec [tierLen]any
			rec[tierUp], rec[tierCeilingField], rec[tierCeilingInc], rec[tierCeilingWin], rec[tierBorrow] = c.up, "", "0", "0", ""
			if c.ceilingField != "" {
				amount := strconv.FormatInt(c.amount, 10)
				rec[tierCeilingField], rec[tierCeilingWin] = c.ceilingField, c.ceilingWin
				rec[tierCeilingInc] = micros(c.amount, c.ceilingEmission)
				rec[tierBorrow] = c.level.Account + ":" + string(c.unit) + "=" + amount
			}
			e.args = append(e.args, rec[:]...)
		}
	}
	for _, c := range p.rates[p.buckets:] {
		var rec [windowLen]any
		rec[windowKey], rec[windowWidth], rec[windowLimit] = c.windowKey, c.width, c.limitN
		rec[windowAmount] = strconv.FormatInt(c.amount, 10)
		e.args = append(e.args, rec[:]...)
	}
	for _, c := range p.quotas {
		var rec [quotaLen]any
		rec[quotaPrefix], rec[quotaAmount] = c.quotaKey, strconv.FormatInt(c.amount, 10)
		rec[quotaCap], rec[quotaKind] = c.quota, c.quotaKind
		e.args = append(e.args, rec[:]...)
	}
	for i, lv := range p.concs {
		var rec [concLen]any
		rec[concKey], rec[concCap] = lim.concKeys[i], strconv.Itoa(lv.Concurrency)
		e.args = append(e.args, rec[:]...)
	}
	for _, c := range p.credits {
		var rec [creditLen]any
		rec[creditGrants], rec[creditTerms], rec[creditLabel] = c.grants, c.term, c.label
		rec[creditAmount] = strconv.FormatInt(c.amount, 10)
		e.args = append(e.args, rec[:]...)
	}
	for _, al := range p.alerts {
		var rec [alertLen]any
		rec[alertRef], rec[alertNext] = strconv.Itoa(al.ref), strconv.FormatInt(al.next, 10)
		rec[alertList], rec[alertLabel] = al.list, al.label
		e.args = append(e.args, rec[:]...)
	}
	if w != nil {
		var rec [waitLen]any
		rec[waitMS], rec[waitTicket], rec[waitMember], rec[waitQueue] = strconv.FormatInt(w.left(), 10), w.ticket, w.member, w.queue
		e.args = append(e.args, rec[:]...)
	}
	return p
}

// micros is amount × emission µs, rounded up and bounded, as the script takes a bucket's
// inc.
func micros(amount int64, emission float64) string {
	return strconv.FormatInt(int64(min(math.Ceil(float64(amount)*emission), maxMicros)), 10)
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
