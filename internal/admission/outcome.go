package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

// Outcome is how an admitted request ended upstream.
type Outcome struct {
	EventID string
	// Status is the upstream HTTP status.
	Status int
	// Units are the units really used, e.g. tokens (optional).
	Units map[policy.Unit]int64
	// Source names the admit node.
	Source string
}

// OutcomeID is the CloudEvents id of the outcome event of an admitted request: one per
// request, so a reported-twice outcome is deduplicated downstream.
func OutcomeID(eventID string) string { return eventID + "/outcome" }

// Outcome releases the request's concurrency leases and appends its outcome event to the
// outbox. Quota refunds for failed requests are reconcile's job. ErrUnknownEvent when the
// event id was not made by NewEventID.
func (a *Admitter) Outcome(ctx context.Context, o Outcome) error {
	shard, org, err := a.keys.ParseEventID(o.EventID)
	if err != nil {
		return err
	}
	record := a.keys.LeaseRecord(shard, o.EventID)
	held, err := a.rdb.Get(ctx, record).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read leases of %s: %w", o.EventID, err)
	}
	keys := []string{a.keys.Outbox(shard), record}
	if held != "" {
		keys = append(keys, strings.Fields(held)...)
	}
	data, err := json.Marshal(event.Outcome{EventID: o.EventID, Status: o.Status, Units: unitMap(o.Units)})
	if err != nil {
		return fmt.Errorf("encode outcome: %w", err)
	}
	head := envelopeHead(OutcomeID(o.EventID), o.Source, event.TypeOutcome, org)
	tail := envelopeData + string(data) + "}"
	if err := a.runScript(ctx, lua.Outcome, keys, org, o.EventID, held, head, tail).Err(); err != nil {
		return fmt.Errorf("record outcome of %s: %w", o.EventID, err)
	}
	return nil
}

// UnitUsage is what an account used of a unit in the current period of its quota.
type UnitUsage struct {
	Used int64
	// Quota is the cap (-1: counted, uncapped); Remaining is what is left (-1: uncapped).
	Quota, Remaining int64
	// Period is the label of the quota's period ("YYYY-MM" or "YYYY-MM-DD").
	Period string
}

// Usage reads, for every unit the account has a quota on at its own level, the counter of
// the current period (by Redis TIME).
func (a *Admitter) Usage(ctx context.Context, p policy.Resolved) (map[policy.Unit]UnitUsage, error) {
	now, err := a.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("read redis time: %w", err)
	}
	lv := p.Path[len(p.Path)-1]
	out := make(map[policy.Unit]UnitUsage)
	var (
		keys  []string
		units []policy.Unit
	)
	for _, u := range policy.Units {
		l, ok := lv.Limits[u]
		if !ok || l.Quota == nil {
			continue
		}
		label := l.QuotaPeriod.Label(now)
		keys = append(keys, a.keys.Quota(p.Org, lv.Account, u, label))
		units = append(units, u)
		out[u] = UnitUsage{Quota: *l.Quota, Period: label}
	}
	if len(keys) == 0 {
		return out, nil
	}
	vals, err := a.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read quota counters: %w", err)
	}
	for i, u := range units {
		uu := out[u]
		if s, ok := vals[i].(string); ok {
			if _, err := fmt.Sscan(s, &uu.Used); err != nil {
				return nil, fmt.Errorf("quota counter %s holds %q: %w", keys[i], s, err)
			}
		}
		uu.Remaining = -1
		if uu.Quota >= 0 {
			uu.Remaining = max(0, uu.Quota-uu.Used)
		}
		out[u] = uu
	}
	return out, nil
}
