package policy

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jackc/pgx/v5"
)

// node is one account row as loaded by the cache.
type node struct {
	id, parent, org, plan string
	kind                  Kind
	concurrency           *int
	priority              *int
	shadow                bool
	credits               []Unit  // units of its credit grants, sorted
	alerts                []Alert // its own alert rules
	granted               map[Unit]int64
	limits                []unitLimit // overrides, sorted by unit
}

type unitLimit struct {
	unit  Unit
	limit Limit
}

// addOverride adds an override, keeping the units sorted so that equal overrides compare
// equal (see levelBuilder).
func (n *node) addOverride(u Unit, l Limit) {
	i := len(n.limits)
	n.limits = append(n.limits, unitLimit{})
	for i > 0 && n.limits[i-1].unit > u {
		n.limits[i] = n.limits[i-1]
		i--
	}
	n.limits[i] = unitLimit{unit: u, limit: l}
}

// planSet is every plan and the smallest one, which unknown or missing plans clamp to.
type planSet struct {
	byID     map[string]*Plan
	smallest *Plan
}

func newPlanSet(byID map[string]*Plan) (planSet, error) {
	ps := planSet{byID: byID}
	for _, p := range byID {
		if ps.smallest == nil || p.Rank < ps.smallest.Rank {
			ps.smallest = p
		}
	}
	if ps.smallest == nil {
		// Without a plan to clamp to, every org would be unlimited: refuse rather than
		// fail open.
		return ps, errors.New("no plans: refusing to load policies without a plan to clamp unknown ones to")
	}
	return ps, nil
}

// clamp returns the plan named id, or the smallest if there is none of that name.
func (ps planSet) clamp(id string) *Plan {
	if p, ok := ps.byID[id]; ok {
		return p
	}
	return ps.smallest
}

// rateSet reports whether an override sets the rate part of a limit. Algorithm alone does
// not count: Normalize fills it in on every limit.
func (l Limit) rateSet() bool {
	return l.RatePerS != 0 || l.Burst != 0 || l.Limit != 0 || l.WindowS != 0 || l.Ceiling != 0
}

// overlay lays an override over a plan's limit field group by field group: the rate part
// (algorithm, rate_per_s, burst, limit, window_s, ceiling) is replaced as a whole when the override
// sets any of it, the quota part (quota, quota_period) when the override sets a quota.
func overlay(base, over Limit) Limit {
	out := base
	if over.rateSet() {
		out.Algorithm, out.RatePerS, out.Burst, out.Limit, out.WindowS, out.Ceiling = over.Algorithm, over.RatePerS, over.Burst, over.Limit, over.WindowS, over.Ceiling
	}
	if over.Quota != nil {
		out.Quota, out.QuotaPeriod = over.Quota, over.QuotaPeriod
	}
	return out.Normalize()
}

// levelBuilder computes the limits of each node. Nodes with the same plan and the same
// overrides (every agent of a fleet, every user left at the defaults) share one read-only
// map: a map per node would be most of the cache's memory and load time.
type levelBuilder struct {
	plans  planSet
	shared map[string]map[Unit]Limit
	key    []byte
}

func newLevelBuilder(plans planSet) *levelBuilder {
	return &levelBuilder{plans: plans, shared: make(map[string]map[Unit]Limit)}
}

// level computes the limits that apply at one node (see the package documentation).
func (b *levelBuilder) level(n *node) Level {
	var plan *Plan
	switch {
	case n.kind == Org:
		plan = b.plans.clamp(n.plan) // unknown or missing → smallest
	case n.plan != "":
		plan = b.plans.clamp(n.plan) // unknown → smallest
	}
	lv := Level{Account: n.id, Kind: n.kind}
	if plan != nil {
		lv.Plan = plan.ID
		lv.Concurrency = plan.Concurrency
	}
	if n.concurrency != nil {
		lv.Concurrency = *n.concurrency
	}

	b.key = appendLevelKey(b.key[:0], lv.Plan, n.limits)
	if n.kind == Org {
		b.key = append(b.key, 0xff) // an org's limits have no ceiling: another map
	}
	if m, ok := b.shared[string(b.key)]; ok {
		lv.Limits = m
		return lv
	}
	size := len(n.limits)
	if plan != nil {
		size += len(plan.Limits)
	}
	m := make(map[Unit]Limit, size)
	if plan != nil {
		for u, l := range plan.Limits {
			m[u] = l
		}
	}
	for _, o := range n.limits {
		m[o.unit] = overlay(m[o.unit], o.limit)
	}
	if n.kind == Org {
		// An org has no parent to borrow from: a plan's ceiling means nothing there.
		for u, l := range m {
			l.Ceiling = 0
			m[u] = l
		}
	}
	b.shared[string(b.key)] = m
	lv.Limits = m
	return lv
}

// appendLevelKey encodes what a node's limits depend on: its plan and its overrides.
func appendLevelKey(key []byte, plan string, limits []unitLimit) []byte {
	key = append(key, plan...)
	for _, o := range limits {
		l := o.limit
		key = append(key, 0)
		key = append(key, o.unit...)
		key = append(key, 0)
		key = append(key, l.Algorithm...)
		key = binary.LittleEndian.AppendUint64(key, math.Float64bits(l.RatePerS))
		key = binary.LittleEndian.AppendUint64(key, uint64(l.Burst))   //nolint:gosec // the bits, as a cache key, not a number
		key = binary.LittleEndian.AppendUint64(key, uint64(l.Limit))   //nolint:gosec // the bits, as a cache key, not a number
		key = binary.LittleEndian.AppendUint64(key, uint64(l.WindowS)) //nolint:gosec // the bits, as a cache key, not a number
		key = binary.LittleEndian.AppendUint64(key, uint64(l.Ceiling)) //nolint:gosec // the bits, as a cache key, not a number
		if l.Quota != nil {
			key = append(key, 1)
			key = binary.LittleEndian.AppendUint64(key, uint64(*l.Quota)) //nolint:gosec // the bits, as a cache key, not a number
			key = append(key, l.QuotaPeriod...)
		} else {
			key = append(key, 0)
		}
	}
	return key
}

// resolveAll computes every node's path. Nodes are taken by depth, orgs first, so a
// node's parent is resolved before it if it can be at all, and every path shares its
// ancestors' levels. A node that cannot be placed (its parent missing or itself not placed,
// a kind not deeper than its parent's, an org that is not its root: only rows written by
// hand can do that, cycles included) is reported in bad and left out: its requests are
// refused rather than admitted with fewer limits than intended.
func resolveAll(nodes []node, plans planSet) (resolved map[string]Resolved, bad map[string]error) {
	resolved = make(map[string]Resolved, len(nodes))
	stamp := snapshotStamps()
	bad = make(map[string]error)
	b := newLevelBuilder(plans)
	reserved := reservations(nodes, b)
	priority := make(map[string]int, len(nodes))
	shadow := make(map[string]bool, len(nodes))
	byDepth := make([][]*node, maxDepth)
	for i := range nodes {
		n := &nodes[i]
		if d := n.kind.Depth(); d >= 0 {
			byDepth[d] = append(byDepth[d], n)
		} else {
			bad[n.id] = fmt.Errorf("unknown kind %q", n.kind)
		}
	}
	for depth, level := range byDepth {
		// One array for the paths of a depth: fewer, larger allocations.
		arena := make([]Level, 0, len(level)*(depth+1))
		for _, n := range level {
			var parent []Level
			if n.kind == Org {
				if n.parent != "" || n.org != n.id {
					bad[n.id] = errors.New("an org with a parent or another org")
					continue
				}
			} else {
				p, ok := resolved[n.parent]
				switch {
				case !ok:
					bad[n.id] = fmt.Errorf("parent %q cannot be placed (missing, misplaced or in a cycle)", n.parent)
					continue
				case p.Path[len(p.Path)-1].Kind.Depth() >= depth:
					bad[n.id] = fmt.Errorf("a %s under a %s", n.kind, p.Path[len(p.Path)-1].Kind)
					continue
				case p.Org != n.org:
					bad[n.id] = fmt.Errorf("names org %q but is under %q", n.org, p.Org)
					continue
				}
				parent = p.Path
			}
			start := len(arena)
			arena = append(arena, parent...)
			lv := b.level(n)
			lv.Reserved = reserved[n.id]
			lv.Credits = n.credits
			lv.Alerts, lv.Granted = effectiveAlerts(n.alerts, lv.Plan, plans), n.granted
			arena = append(arena, lv)
			path := arena[start:len(arena):len(arena)] // capped: an append by a reader copies
			prio := priority[n.parent]
			switch {
			case n.priority != nil:
				prio = *n.priority
			case lv.Plan != "":
				prio = plans.clamp(lv.Plan).Priority
			}
			priority[n.id] = prio
			sh := shadow[n.parent] || n.shadow || lv.Plan != "" && plans.clamp(lv.Plan).Shadow
			shadow[n.id] = sh
			resolved[n.id] = Resolved{Org: path[0].Account, Plan: path[0].Plan, Path: path, Priority: prio, Shadow: sh, Stamp: stamp()}
		}
	}
	return resolved, bad
}

// effectiveAlerts is a level's alert rules: its own, and its plan's of every kind, unit and
// period it has none of.
func effectiveAlerts(own []Alert, plan string, plans planSet) []Alert {
	p, ok := plans.byID[plan]
	if !ok || len(p.alerts) == 0 {
		return own
	}
	out := slices.Clone(own)
	for _, d := range p.alerts {
		if !slices.ContainsFunc(own, func(a Alert) bool { return a.Kind == d.Kind && a.Unit == d.Unit && a.Period == d.Period }) {
			out = append(out, d)
		}
	}
	return out
}

// reservations sums, per parent and unit, the guarantees of its children: their token
// buckets with a ceiling (Limit.Guaranteed). Orgs guarantee nothing (they have no parent).
func reservations(nodes []node, b *levelBuilder) map[string]map[Unit]Reservation {
	out := make(map[string]map[Unit]Reservation)
	for i := range nodes {
		n := &nodes[i]
		if n.kind == Org || n.parent == "" || n.kind.Depth() < 0 {
			continue
		}
		for u, l := range b.level(n).Limits {
			if !l.Guaranteed() {
				continue
			}
			m := out[n.parent]
			if m == nil {
				m = make(map[Unit]Reservation)
				out[n.parent] = m
			}
			r := m[u]
			r.RatePerS += l.RatePerS
			r.Burst += l.Burst
			m[u] = r
		}
	}
	return out
}

// maxDepth is the number of kinds, the longest possible path: org, team, user, agent.
const maxDepth = 4

// The statements of loadPlans.
var (
	//go:embed sql/load_plans.sql
	loadPlansSQL string
	//go:embed sql/load_plan_limits.sql
	loadPlanLimitsSQL string
)

// loadPlans reads every plan with its limits and priority.
func loadPlans(ctx context.Context, tx pgx.Tx) (map[string]*Plan, error) {
	byID := make(map[string]*Plan)
	rows, err := tx.Query(ctx, loadPlansSQL)
	if err != nil {
		return nil, fmt.Errorf("read plans: %w", err)
	}
	for rows.Next() {
		p := &Plan{Limits: make(map[Unit]Limit)}
		if err := rows.Scan(&p.ID, &p.Rank, &p.Concurrency, &p.Priority, &p.Shadow); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read plans: %w", err)
		}
		byID[p.ID] = p
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read plans: %w", err)
	}

	rows, err = tx.Query(ctx, loadPlanLimitsSQL)
	if err != nil {
		return nil, fmt.Errorf("read plan limits: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			plan string
			u    Unit
			l    limitRow
		)
		if err := rows.Scan(append([]any{&plan, &u}, l.dest()...)...); err != nil {
			return nil, fmt.Errorf("read plan limits: %w", err)
		}
		if p, ok := byID[plan]; ok {
			p.Limits[u] = l.toLimit()
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read plan limits: %w", err)
	}
	return byID, nil
}
