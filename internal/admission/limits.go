package admission

import (
	"crypto/sha256"
	"encoding/base64"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/wire"
)

// limits is what the script call of a decision needs from its policy, apart from the
// amounts: each limit's keys and constant arguments, and the program compiled from them. It is
// derived once per policy and Admitter and kept in the Admitter's limitCache.
type limits struct {
	state  string      // the org's state hash
	idTail string      // ".<shard>.<org>", how the org's event ids end
	checks []limitArgs // by level, org first, then in policy.Units order
	// buckets are the token buckets, unit by unit (policy.Units order), each unit's from
	// the account up to the org: the chains the script walks (lua/admit.lua).
	buckets []limitArgs
	// tiered marks the units whose chain has a ceiling: their decisions send tier records.
	tiered   map[policy.Unit]bool
	concs    []policy.Level
	concKeys []string
	credits  []creditArgs // by level, org first, then in the level's order of units
	alerts   []*alertArgs // the levels' alert rules
	// program is what the script checks for the account (compile), field its name in the
	// org's mirror: a version (a hash of the program) and the account. inlined is when
	// this node last sent the program inline (unix ns).
	program, field string
	inlined        atomic.Int64
}

// alertArgs is one alert rule of a level with what it watches (a quota of limits.checks, or
// a balance of limits.credits) and its thresholds in units, ascending.
type alertArgs struct {
	check  *limitArgs  // the quota watched, nil for a balance
	credit *creditArgs // the balance watched, nil for a quota
	at     []int64     // the thresholds in units, ascending
	list   string      // the script's list: "<at>:<spec>,…"
	label  string
	// seen is the highest quota counter this node was told of in a period: thresholds at or
	// below it have fired (the decision that reached them had them), so decisions leave
	// them out. A new policy (any change of the policies) starts again from nothing.
	seen atomic.Pointer[seenCounter]
}

type seenCounter struct {
	period string
	used   int64
}

// record is the script's alert record of a for the decision p, if p charges what a watches
// and, for a quota, a threshold is left above the counter seen in the current period.
func (a *alertArgs) record(p *plan, per periods) (alertRecord, bool) {
	if a.check != nil {
		for i, c := range p.quotas {
			if c.limitArgs != a.check {
				continue
			}
			label := per.month
			if a.check.limit.QuotaPeriod == policy.Day {
				label = per.day
			}
			next := a.at[0]
			if s := a.seen.Load(); s != nil && label != "" && s.period == label {
				j := sort.Search(len(a.at), func(j int) bool { return a.at[j] > s.used })
				if j == len(a.at) {
					return alertRecord{}, false // every threshold fired this period
				}
				next = a.at[j]
			}
			return alertRecord{alertArgs: a, ref: i + 1, next: next}, true
		}
		return alertRecord{}, false
	}
	for i, c := range p.credits {
		if c.creditArgs == a.credit {
			// A balance goes up again (a top-up re-arms its thresholds): the script looks
			// whenever it is below the highest.
			return alertRecord{alertArgs: a, ref: -(i + 1), next: a.at[len(a.at)-1]}, true
		}
	}
	return alertRecord{}, false
}

// saw records that the quota counter a watches was used in period.
func (a *alertArgs) saw(period string, used int64) {
	for {
		old := a.seen.Load()
		if old != nil && old.period == period && old.used >= used {
			return
		}
		if a.seen.CompareAndSwap(old, &seenCounter{period: period, used: used}) {
			return
		}
	}
}

// alertsOf derives the alert rules of pol that l can watch: a quota_percent rule needs a
// quota of its unit and period at its level, a balance rule credit grants of its unit (and,
// for balance_percent, units granted). Thresholds below one unit are left out.
func (l *limits) alertsOf(pol policy.Resolved) {
	for _, lv := range pol.Path {
		for _, al := range lv.Alerts {
			arg := alertArgs{label: lv.Account + ":" + string(al.Unit)}
			var of int64 // what percentages are of
			switch al.Kind {
			case policy.QuotaPercent:
				for i := range l.checks {
					c := &l.checks[i]
					if c.level.Account == lv.Account && c.unit == al.Unit && c.limit.HasQuota() && c.limit.QuotaPeriod == al.Period {
						arg.check, of = c, *c.limit.Quota
					}
				}
			default:
				for i := range l.credits {
					c := &l.credits[i]
					if c.level.Account == lv.Account && c.unit == al.Unit {
						arg.credit, of = c, lv.Granted[al.Unit]
					}
				}
			}
			if arg.check == nil && arg.credit == nil {
				continue
			}
			var list []string
			for _, t := range al.Thresholds { // ascending (policy.AlertRule)
				at := t
				if al.Kind != policy.BalanceBelow {
					at = ceilDiv(of*t, 100)
				}
				if at > 0 && (len(arg.at) == 0 || at > arg.at[len(arg.at)-1]) {
					arg.at = append(arg.at, at)
					list = append(list, strconv.FormatInt(at, 10)+":"+al.Spec(t))
				}
			}
			if len(arg.at) > 0 {
				arg.list = strings.Join(list, ",")
				l.alerts = append(l.alerts, &arg)
			}
		}
	}
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// limitArgs is one unit's limit at one level.
type limitArgs struct {
	level policy.Level
	unit  policy.Unit
	limit policy.Limit
	// field names a token bucket in the org's state hash; emission is its emission
	// interval (µs per unit) and win its burst × emission interval (µs), as the script
	// takes it. Empty: no token bucket. The bucket is the level's spare: its limit less its
	// children's guarantees (Level.Reserved), spareRate per second up to spareBurst.
	field           string
	emission        float64
	win             int64
	spareRate       float64
	spareBurst      int64
	up              int    // the tier record's up (lua/admit.lua)
	index           int    // the place in limits.checks
	ceilingField    string // the ceiling's bucket, "" when the limit has none
	ceilingEmission float64
	ceilingWin      int64
	// windowKey is a sliding window's sorted set. Empty: no sliding window.
	windowKey string
	// quotaKey starts the counters' keys (the period's label ends them); quotaKind is the
	// script's: "m" monthly, "d" daily. Empty: no quota.
	quotaKey, quotaKind string
}

// unitLetter shortens a unit in a bucket's field name.
var unitLetter = map[policy.Unit]string{policy.Requests: "r", policy.Tokens: "t", policy.Credits: "c", policy.CostMicros: "m"}

// limitsOf returns pol's limits in shard, derived at the first decision of the policy.
func (a *Admitter) limitsOf(shard int, pol policy.Resolved) *limits {
	if l := a.derived.get(pol.Stamp); l != nil {
		return l
	}
	l := &limits{state: a.keys.State(shard, pol.Org), idTail: a.keys.EventIDTail(shard, pol.Org)}
	for _, lv := range pol.Path {
		for _, u := range policy.Units {
			lim, ok := lv.Limits[u]
			if !ok || (!lim.HasRate() && lim.Quota == nil) {
				continue
			}
			c := limitArgs{level: lv, unit: u, limit: lim}
			switch {
			case lim.HasRate() && lim.Algorithm == policy.SlidingWindow:
				c.windowKey = a.keys.Window(shard, lv.Account, u)
			case lim.HasRate():
				a.bucketArgs(&c, lv)
			}
			c.index = len(l.checks)
			if lim.Quota != nil {
				c.quotaKey = a.keys.QuotaIn(shard, lv.Account, u, "")
				c.quotaKind = "m"
				if lim.QuotaPeriod == policy.Day {
					c.quotaKind = "d"
				}
			}
			l.checks = append(l.checks, c)
		}
		if lv.Concurrency > 0 {
			l.concs = append(l.concs, lv)
			l.concKeys = append(l.concKeys, a.keys.Leases(shard, lv.Account))
		}
		for _, u := range lv.Credits {
			l.credits = append(l.credits, creditArgs{level: lv, unit: u, grants: a.keys.GrantsIn(shard, lv.Account, u),
				term: a.keys.GrantTermsIn(shard, lv.Account, u), label: lv.Account + ":" + string(u)})
		}
	}
	l.buckets, l.tiered = bucketChains(pol, l.checks)
	l.alertsOf(pol)
	l.compile(pol)
	a.derived.put(pol.Stamp, l)
	return l
}

// limitCache holds the limits derived from the policies of the newest snapshots, by
// their stamps: each is derived once per snapshot, not once per request. The first policy
// of a newer snapshot retires the current map to old, and drops the one before it; an
// entry found in old moves back, so an account's limits outlive a reload only while it
// is still being decided on with its earlier policy.
type limitCache struct {
	mu       sync.RWMutex
	snapshot uint64
	cur, old map[policy.Stamp]*limits
}

// get returns the limits derived from the policy stamped s, or nil.
func (c *limitCache) get(s policy.Stamp) *limits {
	if s == 0 {
		return nil
	}
	c.mu.RLock()
	l, ok := c.cur[s]
	if !ok {
		l = c.old[s]
	}
	c.mu.RUnlock()
	if !ok && l != nil {
		c.put(s, l)
	}
	return l
}

// put keeps l as the limits of the policy stamped s (a policy without a stamp is derived
// at each decision).
func (c *limitCache) put(s policy.Stamp, l *limits) {
	if s == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := s.Snapshot(); n > c.snapshot || c.cur == nil {
		c.snapshot = max(c.snapshot, n)
		c.old, c.cur = c.cur, make(map[policy.Stamp]*limits, len(c.cur))
	}
	c.cur[s] = l
}

// bucketArgs fills in c's token bucket: the spare of the level's limit (its limit less its
// children's guarantees) and the ceiling's bucket if the limit has one.
func (a *Admitter) bucketArgs(c *limitArgs, lv policy.Level) {
	lim := c.limit
	letter := unitLetter[c.unit]
	if letter == "" {
		letter = string(c.unit)
	}
	c.field = lv.Account + ":" + letter
	c.spareRate, c.spareBurst = lim.RatePerS, lim.Burst
	if r, ok := lv.Reserved[c.unit]; ok {
		c.spareRate, c.spareBurst = lim.RatePerS-r.RatePerS, lim.Burst-r.Burst
	}
	if c.spareRate <= 0 || c.spareBurst <= 0 {
		// Guarantees take all of it: nothing else passes, ever (the script's "never").
		c.spareRate, c.spareBurst = 0, 0
		c.emission, c.win = maxMicros, 0
	} else {
		c.emission = 1e6 / c.spareRate
		c.win = int64(min(math.Floor(float64(c.spareBurst)*c.emission), maxMicros))
	}
	if lim.Guaranteed() {
		c.ceilingField = c.field + "^"
		c.ceilingEmission = 1e6 / lim.CeilingRate()
		c.ceilingWin = int64(min(math.Floor(float64(lim.Ceiling)*c.ceilingEmission), maxMicros))
	}
}

// bucketChains orders the token buckets of checks unit by unit, each unit's from the
// account up to the org, and sets each one's up: whether the next is the level above in
// the same unit's chain, and whether that level reserves this one's guarantee (it is the
// direct parent). It reports the units whose chain has a ceiling.
func bucketChains(pol policy.Resolved, checks []limitArgs) ([]limitArgs, map[policy.Unit]bool) {
	depth := make(map[string]int, len(pol.Path))
	for i, lv := range pol.Path {
		depth[lv.Account] = i
	}
	var out []limitArgs
	var tiered map[policy.Unit]bool
	for _, u := range policy.Units {
		start := len(out)
		for i := len(checks) - 1; i >= 0; i-- {
			if c := checks[i]; c.unit == u && c.field != "" {
				out = append(out, c)
			}
		}
		chain := out[start:]
		for i := range chain {
			c := &chain[i]
			c.up = 0
			if i+1 < len(chain) {
				c.up = 1
				if c.limit.Guaranteed() && depth[chain[i+1].level.Account] == depth[c.level.Account]-1 {
					c.up = 2
				}
			}
			if c.ceilingField != "" {
				if tiered == nil {
					tiered = make(map[policy.Unit]bool)
				}
				tiered[u] = true
			}
		}
	}
	return out, tiered
}

// creditArgs is one unit's credit balance at one level: the keys of its grants.
type creditArgs struct {
	level        policy.Level
	unit         policy.Unit
	grants, term string
	label        string // "<account>:<unit>"
}

// maxMicros bounds a bucket's inc and win (about 31 years), so that a TAT stays an exact
// integer in Lua's doubles; the script bounds inc (amount × emission) by the same.
const maxMicros = 1e15

// The account's program (lua/admit.lua, "Programs"): a MessagePack array the script reads
// once per call from the org's mirror in Redis (cmsgpack, about three times faster than
// cjson for the same program: no number is parsed from text), in blocks. Each block's constants are its
// fields' positions; the names beside them are the script's locals, and TestScriptLayout
// requires the script to read the same names in the same order ("-- layout: program",
// "bucket", "tier", "window", "quota", "conc", "credit", "alert"). A unit is its place in
// policy.Units, from 1: the script takes the decision's amount of it.
const (
	progPriority = iota
	progIDTail   // ".<shard>.<org>": how the org's event ids end
	progEvent    // the compact event's policy fields ("<org>|<plan>|<path>|")
	progBuckets
	progTiered // 1: a tier record follows each bucket record (a chain has a ceiling)
	progWindows
	progQuotas
	progConcs
	progCredits
	progAlerts
	progLen
)

const (
	bucketField    = iota
	bucketEmission // µs per unit: inc = amount × emission, rounded up
	bucketWin      // burst × emission interval, µs
	bucketUnit
	bucketLen
)

const (
	tierUp           = iota // 0 the chain's last, 1 the level above follows, 2 and reserves for this one
	tierCeilingField        // "" when the level has no ceiling
	tierCeilingEmission
	tierCeilingWin
	tierLabel // "<account>:<unit>", what the event names a borrowing by ("" without a ceiling)
	tierLen
)

const (
	windowKey   = iota
	windowWidth // ms
	windowLimit
	windowUnit
	windowLen
)

const (
	quotaPrefix = iota
	quotaCap    // -1: counted, not capped
	quotaKind   // "m" or "d"
	quotaUnit
	quotaLen
)

const (
	concKey = iota
	concCap
	concLen
)

const (
	creditGrants = iota // Keys.Grants
	creditTerms         // Keys.GrantTerms
	creditLabel         // "<account>:<unit>"
	creditUnit
	creditLen
)

const (
	alertRef   = iota // i > 0: the program's quota record i; i < 0: its credit record -i
	alertList         // the thresholds: "<units>:<spec>,…" ascending (spec: policy.Alert.Spec)
	alertLabel        // "<account>:<unit>"
	alertLen
)

// progNames are the script's names of each program block's fields, by position.
var progNames = map[string][]string{
	"program": (&[progLen]string{progPriority: "prio", progIDTail: "id_tail", progEvent: "ev_static",
		progBuckets: "pn_bucket", progTiered: "tiered", progWindows: "pn_window", progQuotas: "pn_quota",
		progConcs: "pn_conc", progCredits: "pn_credit", progAlerts: "pn_alert"})[:],
	"bucket": (&[bucketLen]string{bucketField: "field", bucketEmission: "emission", bucketWin: "win", bucketUnit: "unit"})[:],
	"tier": (&[tierLen]string{tierUp: "up", tierCeilingField: "cfield", tierCeilingEmission: "cemission",
		tierCeilingWin: "cwin", tierLabel: "label"})[:],
	"window": (&[windowLen]string{windowKey: "key", windowWidth: "width", windowLimit: "limit", windowUnit: "unit"})[:],
	"quota":  (&[quotaLen]string{quotaPrefix: "prefix", quotaCap: "quota", quotaKind: "kind", quotaUnit: "unit"})[:],
	"conc":   (&[concLen]string{concKey: "key", concCap: "cap"})[:],
	"credit": (&[creditLen]string{creditGrants: "gkey", creditTerms: "tkey", creditLabel: "label", creditUnit: "unit"})[:],
	"alert":  (&[alertLen]string{alertRef: "ref", alertList: "list", alertLabel: "label"})[:],
}

// unitIndex is a unit's place in policy.Units, from 1, as the program names it.
func unitIndex(u policy.Unit) int {
	for i, v := range policy.Units {
		if v == u {
			return i + 1
		}
	}
	return 0 // not reached: units are validated
}

// compile derives the account's program from l and names it: its version is the first 66
// bits of its SHA-256 (11 characters), so every node holding the same policy writes and
// reads the same field, and a node holding another finds none and sends its own.
func (l *limits) compile(pol policy.Resolved) {
	var quotas, tiered, windows int
	for _, c := range l.checks {
		if c.quotaKey != "" {
			quotas++
		}
		if c.windowKey != "" {
			windows++
		}
	}
	if len(l.tiered) > 0 {
		tiered = 1
	}
	var h [progLen]any
	h[progPriority], h[progIDTail], h[progEvent] = pol.Priority, l.idTail, wire.CompactPolicy(pol)
	h[progBuckets], h[progTiered], h[progWindows] = len(l.buckets), tiered, windows
	h[progQuotas], h[progConcs], h[progCredits], h[progAlerts] = quotas, len(l.concs), len(l.credits), len(l.alerts)
	p := h[:]
	for _, c := range l.buckets {
		var rec [bucketLen]any
		rec[bucketField], rec[bucketEmission], rec[bucketWin], rec[bucketUnit] = c.field, c.emission, c.win, unitIndex(c.unit)
		p = append(p, rec[:]...)
	}
	for i := 0; tiered == 1 && i < len(l.buckets); i++ {
		c := l.buckets[i]
		var rec [tierLen]any
		rec[tierUp], rec[tierCeilingField], rec[tierCeilingEmission], rec[tierCeilingWin], rec[tierLabel] = c.up, "", 0, 0, ""
		if c.ceilingField != "" {
			rec[tierCeilingField], rec[tierCeilingEmission], rec[tierCeilingWin] = c.ceilingField, c.ceilingEmission, c.ceilingWin
			rec[tierLabel] = c.level.Account + ":" + string(c.unit)
		}
		p = append(p, rec[:]...)
	}
	quotaRef := map[*limitArgs]int{}
	for i := range l.checks {
		if c := &l.checks[i]; c.windowKey != "" {
			var rec [windowLen]any
			rec[windowKey], rec[windowWidth], rec[windowLimit], rec[windowUnit] = c.windowKey, c.limit.WindowS*1000, c.limit.Limit, unitIndex(c.unit)
			p = append(p, rec[:]...)
		}
	}
	for i := range l.checks {
		if c := &l.checks[i]; c.quotaKey != "" {
			var rec [quotaLen]any
			rec[quotaPrefix], rec[quotaCap], rec[quotaKind], rec[quotaUnit] = c.quotaKey, *c.limit.Quota, c.quotaKind, unitIndex(c.unit)
			p = append(p, rec[:]...)
			quotaRef[c] = len(quotaRef) + 1
		}
	}
	for i, lv := range l.concs {
		var rec [concLen]any
		rec[concKey], rec[concCap] = l.concKeys[i], lv.Concurrency
		p = append(p, rec[:]...)
	}
	creditRef := map[*creditArgs]int{}
	for i := range l.credits {
		c := &l.credits[i]
		var rec [creditLen]any
		rec[creditGrants], rec[creditTerms], rec[creditLabel], rec[creditUnit] = c.grants, c.term, c.label, unitIndex(c.unit)
		p = append(p, rec[:]...)
		creditRef[c] = i + 1
	}
	for _, al := range l.alerts {
		var rec [alertLen]any
		if al.check != nil {
			rec[alertRef] = quotaRef[al.check]
		} else {
			rec[alertRef] = -creditRef[al.credit]
		}
		rec[alertList], rec[alertLabel] = al.list, al.label
		p = append(p, rec[:]...)
	}
	b, err := msgpack.Marshal(p)
	if err != nil {
		panic("admission: a program does not encode: " + err.Error()) // numbers and strings only
	}
	sum := sha256.Sum256(b)
	l.program = string(b)
	l.field = base64.RawURLEncoding.EncodeToString(sum[:])[:11] + pol.Account()
}

// mirrorRefresh is how often a node sends a program inline although the mirror holds it,
// so that the mirror of an org in use never expires (the script's MIRROR_TTL is a day).
const mirrorRefresh = time.Hour

// sendInline reports whether a decision encoded now sends the program inline: the first
// of this node's, and one an hour after.
func (l *limits) sendInline(now time.Time) bool {
	last := l.inlined.Load()
	if last != 0 && now.UnixNano()-last < int64(mirrorRefresh) {
		return false
	}
	return l.inlined.CompareAndSwap(last, now.UnixNano())
}
