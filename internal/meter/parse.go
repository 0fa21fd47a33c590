package meter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// outcomeSuffix makes an outcome's CloudEvents id from its admission's event id
// (admission.OutcomeID; a test keeps the two equal).
const outcomeSuffix = "/outcome"

// Event times and periods outside these years are refused: Redis TIME cannot produce them,
// and each month would otherwise become a partition.
const minYear, maxYear = 2000, 2199

// usageRow is one row of usage_events.
type usageRow struct {
	EventID        string
	BillingPeriod  time.Time // first day of the event time's UTC month
	EventTime      time.Time
	ChargedPeriod  time.Time // first day of data.period
	Org            string
	Account        string
	AccountKind    string
	Path           []string
	APIKeyID       string // "" is stored as NULL, as are the three below
	IdempotencyKey string
	Plan           string
	Tool           string
	Source         string
	FailOpen       bool
	ShadowRefusal  string // "" is stored as NULL
	Units          units
	Borrowed       []borrowRow // rows of usage_borrowings
	Credits        []creditRow // rows of credit_consumptions
	Partition      int
	Offset         int64
}

// borrowRow is one row of usage_borrowings, with the event's columns taken from its
// usageRow: Account took Units of Unit from its parent Lender's spare rate capacity.
type borrowRow struct {
	Account, Lender, Unit string
	Units                 int64
}

// creditRow is one row of credit_consumptions, with the event's columns taken from its
// usageRow: the request drew Units of Unit from Account's grant Grant.
type creditRow struct {
	Account, Unit, Grant string
	Units                int64
}

// outcomeRow is one row of usage_outcomes.
type outcomeRow struct {
	EventID     string
	Status      int
	Units       units
	OutcomeTime time.Time
	Source      string
	Partition   int
	Offset      int64
}

// alertRow is one row of usage_alerts: a threshold crossed (event.Threshold).
type alertRow struct {
	ID          string
	EventTime   time.Time
	Org         string
	Account     string
	Path        []string
	Unit        string
	Kind        string
	Threshold   int64
	At          int64
	Value       int64
	Period      string
	Grant       string // "" for a quota's threshold: stored as NULL
	TriggeredBy string
	Admitted    bool
	Payload     []byte // the CloudEvent as received
}

// voidRow is one row of usage_voids.
type voidRow struct {
	EventID   string
	Attempt   string
	Reason    string
	VoidTime  time.Time
	Source    string
	Partition int
	Offset    int64
}

// units holds the four units; a nil field was not reported.
type units struct {
	Requests, Tokens, Credits, CostMicros *int64
}

// parseUnits checks that every unit is known and at least 0.
func parseUnits(field string, m map[string]int64) (units, error) {
	var u units
	for name, v := range m {
		if !policy.Unit(name).Valid() {
			return units{}, fmt.Errorf("%s: unknown unit %q (known: requests, tokens, credits, cost_micros)", field, name)
		}
		if v < 0 {
			return units{}, fmt.Errorf("%s.%s = %d: want at least 0", field, name, v)
		}
		switch policy.Unit(name) {
		case policy.Requests:
			u.Requests = &v
		case policy.Tokens:
			u.Tokens = &v
		case policy.Credits:
			u.Credits = &v
		case policy.CostMicros:
			u.CostMicros = &v
		}
	}
	return u, nil
}

// parsed is what a message became: exactly one of the five is set.
type parsed struct {
	usage   *usageRow
	outcome *outcomeRow
	void    *voidRow
	alert   *alertRow
	err     error // the reason the message is a dead letter
}

// parse decodes and validates one message's value. Anything it accepts must be writable:
// a row PostgreSQL refused for its content would stop the pipeline (the writer then falls
// back to writing rows one by one, see store.writeEach).
func parse(value []byte, partition int, offset int64) parsed {
	m, ok := wire.DecodeFast(value)
	if !ok {
		var err error
		if m, err = decode(value); err != nil {
			return parsed{err: err}
		}
	}
	if err := checkEnvelope(m.CloudEvent); err != nil {
		return parsed{err: err}
	}
	switch {
	case m.Admitted != nil:
		row, err := parseAdmitted(m.CloudEvent, m.Admitted)
		if err != nil {
			return parsed{err: err}
		}
		row.Partition, row.Offset = partition, offset
		return parsed{usage: row}
	case m.Outcome != nil:
		row, err := parseOutcome(m.CloudEvent, m.Outcome)
		if err != nil {
			return parsed{err: err}
		}
		row.Partition, row.Offset = partition, offset
		return parsed{outcome: row}
	case m.Voided != nil:
		row, err := parseVoid(m.CloudEvent, m.Voided)
		if err != nil {
			return parsed{err: err}
		}
		row.Partition, row.Offset = partition, offset
		return parsed{void: row}
	case m.Threshold != nil:
		row, err := parseThreshold(m.CloudEvent, m.Threshold, value)
		if err != nil {
			return parsed{err: err}
		}
		return parsed{alert: row}
	}
	return parsed{err: fmt.Errorf("type %q: want %s, %s, %s or %s", m.CloudEvent.Type, event.TypeAdmitted, event.TypeOutcome, event.TypeVoided, event.TypeThreshold)}
}

// decode decodes any message with encoding/json: the envelope, then the data of a known
// type once the envelope is found valid (its errors come first).
func decode(value []byte) (wire.Decoded, error) {
	var m wire.Decoded
	if err := json.Unmarshal(value, &m.CloudEvent); err != nil {
		return wire.Decoded{}, fmt.Errorf("not a CloudEvent in JSON: %w", err)
	}
	if checkEnvelope(m.CloudEvent) != nil {
		return m, nil
	}
	switch m.CloudEvent.Type {
	case event.TypeAdmitted:
		m.Admitted = new(event.Admitted)
		if err := json.Unmarshal(m.CloudEvent.Data, m.Admitted); err != nil {
			return wire.Decoded{}, fmt.Errorf("data: %w", err)
		}
	case event.TypeOutcome:
		m.Outcome = new(event.Outcome)
		if err := json.Unmarshal(m.CloudEvent.Data, m.Outcome); err != nil {
			return wire.Decoded{}, fmt.Errorf("data: %w", err)
		}
	case event.TypeVoided:
		m.Voided = new(event.Voided)
		if err := json.Unmarshal(m.CloudEvent.Data, m.Voided); err != nil {
			return wire.Decoded{}, fmt.Errorf("data: %w", err)
		}
	case event.TypeThreshold:
		m.Threshold = new(event.Threshold)
		if err := json.Unmarshal(m.CloudEvent.Data, m.Threshold); err != nil {
			return wire.Decoded{}, fmt.Errorf("data: %w", err)
		}
	}
	return m, nil
}

func checkEnvelope(ce event.CloudEvent) error {
	if ce.SpecVersion != "1.0" {
		return fmt.Errorf("specversion %q: want 1.0", ce.SpecVersion)
	}
	if err := printable("id", ce.ID, 255, false); err != nil {
		return err
	}
	if err := text("source", ce.Source, 255, false); err != nil {
		return err
	}
	if ce.DataContentType != "" && ce.DataContentType != "application/json" {
		return fmt.Errorf("datacontenttype %q: want application/json", ce.DataContentType)
	}
	if ce.Time.IsZero() {
		return errors.New("time: missing")
	}
	if y := ce.Time.UTC().Year(); y < minYear || y > maxYear {
		return fmt.Errorf("time %s: want a year in %d-%d", ce.Time.Format(time.RFC3339Nano), minYear, maxYear)
	}
	if d := bytes.TrimSpace(ce.Data); len(d) == 0 || d[0] != '{' {
		return errors.New("data: missing or not a JSON object")
	}
	return nil
}

// eventTime is the time as PostgreSQL keeps it (microseconds), so that the billing period
// computed here is the one PostgreSQL would compute from the stored time.
func eventTime(ce event.CloudEvent) time.Time { return ce.Time.UTC().Truncate(time.Microsecond) }

func parseAdmitted(ce event.CloudEvent, d *event.Admitted) (*usageRow, error) {
	if len(d.Path) == 0 {
		return nil, errors.New("data.path: missing")
	}
	if d.Org == "" {
		return nil, errors.New("data.org: missing")
	}
	if d.Org != d.Path[0].Account {
		return nil, fmt.Errorf("data.org %q is not data.path[0] %q", d.Org, d.Path[0].Account)
	}
	path := make([]string, len(d.Path))
	depth := -1
	for i, n := range d.Path {
		if !policy.ValidID(n.Account) {
			return nil, fmt.Errorf("data.path[%d].account %q: not an account id", i, n.Account)
		}
		k := policy.Kind(n.Kind).Depth()
		if k < 0 || (i == 0) != (policy.Kind(n.Kind) == policy.Org) || k <= depth {
			return nil, fmt.Errorf("data.path[%d].kind %q: want org first, then deeper kinds (team, user, agent)", i, n.Kind)
		}
		depth = k
		path[i] = n.Account
	}
	last := d.Path[len(d.Path)-1]
	if d.Account != last.Account {
		return nil, fmt.Errorf("data.account %q is not the last of data.path %q", d.Account, last.Account)
	}
	if d.APIKeyID != "" && !policy.ValidID(d.APIKeyID) {
		return nil, fmt.Errorf("data.api_key_id %q: not a key id", d.APIKeyID)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"data.idempotency_key", d.IdempotencyKey, 255}, {"data.plan", d.Plan, 64}, {"data.tool", d.Tool, 255}} {
		if err := text(f.name, f.v, f.max, true); err != nil {
			return nil, err
		}
	}
	u, err := parseUnits("data.units", d.Units)
	if err != nil {
		return nil, err
	}
	borrowed, err := parseBorrowed(d.Borrowed, path)
	if err != nil {
		return nil, err
	}
	switch d.ShadowRefusal {
	case "", "rate_limited", "quota_exceeded", "insufficient_balance":
	default:
		return nil, fmt.Errorf("data.shadow_refusal %q: want rate_limited, quota_exceeded or insufficient_balance", d.ShadowRefusal)
	}
	credits, err := parseCredits(d.Credits, path)
	if err != nil {
		return nil, err
	}
	charged, err := period.ParseMonth(d.Period)
	if err != nil || charged.Year() < minYear || charged.Year() > maxYear {
		return nil, fmt.Errorf("data.period %q: want YYYY-MM", d.Period)
	}
	at := eventTime(ce)
	return &usageRow{
		EventID: ce.ID, BillingPeriod: period.MonthStart(at), EventTime: at, ChargedPeriod: charged,
		Org: d.Org, Account: d.Account, AccountKind: last.Kind, Path: path,
		APIKeyID: d.APIKeyID, IdempotencyKey: d.IdempotencyKey, Plan: d.Plan, Tool: d.Tool,
		Source: ce.Source, FailOpen: d.FailOpen, ShadowRefusal: d.ShadowRefusal, Units: u, Borrowed: borrowed, Credits: credits,
	}, nil
}

// parseBorrowed checks an admission's borrowings against its path (account ids, org
// first): each borrower is an account of the path below the org, lent by the node before
// it, borrowing more than 0 of a known unit, at most once per unit.
func parseBorrowed(bs []event.Borrowing, path []string) ([]borrowRow, error) {
	if len(bs) == 0 {
		return nil, nil
	}
	rows := make([]borrowRow, 0, len(bs))
	for i, b := range bs {
		at := slices.Index(path, b.Account)
		if at < 1 {
			return nil, fmt.Errorf("data.borrowed[%d].account %q: not an account of data.path below the org", i, b.Account)
		}
		if b.From != path[at-1] {
			return nil, fmt.Errorf("data.borrowed[%d].from %q: want %q, the account's parent in data.path", i, b.From, path[at-1])
		}
		if !policy.Unit(b.Unit).Valid() {
			return nil, fmt.Errorf("data.borrowed[%d].unit %q: unknown (known: requests, tokens, credits, cost_micros)", i, b.Unit)
		}
		if b.Units <= 0 {
			return nil, fmt.Errorf("data.borrowed[%d].units = %d: want more than 0", i, b.Units)
		}
		for _, r := range rows {
			if r.Account == b.Account && r.Unit == b.Unit {
				return nil, fmt.Errorf("data.borrowed[%d]: %s borrowed %s twice", i, b.Account, b.Unit)
			}
		}
		rows = append(rows, borrowRow{Account: b.Account, Lender: b.From, Unit: b.Unit, Units: b.Units})
	}
	return rows, nil
}

// parseCredits checks an admission's credit draws against its path (account ids, org
// first): each draws more than 0 of a known unit from a grant (a grant id) of an account
// of the path, each grant at most once.
func parseCredits(cs []event.CreditDraw, path []string) ([]creditRow, error) {
	if len(cs) == 0 {
		return nil, nil
	}
	rows := make([]creditRow, 0, len(cs))
	for i, c := range cs {
		if !slices.Contains(path, c.Account) {
			return nil, fmt.Errorf("data.credits[%d].account %q: not an account of data.path", i, c.Account)
		}
		if !policy.Unit(c.Unit).Valid() {
			return nil, fmt.Errorf("data.credits[%d].unit %q: unknown (known: requests, tokens, credits, cost_micros)", i, c.Unit)
		}
		if !event.ValidGrantID(c.Grant) {
			return nil, fmt.Errorf("data.credits[%d].grant %q: want gr_ and 32 lowercase hex digits", i, c.Grant)
		}
		if c.Units <= 0 {
			return nil, fmt.Errorf("data.credits[%d].units = %d: want more than 0", i, c.Units)
		}
		for _, r := range rows {
			if r.Grant == c.Grant {
				return nil, fmt.Errorf("data.credits[%d]: grant %s drawn twice", i, c.Grant)
			}
		}
		rows = append(rows, creditRow{Account: c.Account, Unit: c.Unit, Grant: c.Grant, Units: c.Units})
	}
	return rows, nil
}

func parseOutcome(ce event.CloudEvent, d *event.Outcome) (*outcomeRow, error) {
	if err := printable("data.event_id", d.EventID, 255-len(outcomeSuffix), false); err != nil {
		return nil, err
	}
	if ce.ID != d.EventID+outcomeSuffix {
		return nil, fmt.Errorf("id %q: want data.event_id + %q", ce.ID, outcomeSuffix)
	}
	if d.Status < 100 || d.Status > 599 {
		return nil, fmt.Errorf("data.status %d: want 100-599", d.Status)
	}
	u, err := parseUnits("data.units", d.Units)
	if err != nil {
		return nil, err
	}
	return &outcomeRow{EventID: d.EventID, Status: d.Status, Units: u, OutcomeTime: eventTime(ce), Source: ce.Source}, nil
}

func parseVoid(ce event.CloudEvent, d *event.Voided) (*voidRow, error) {
	if err := printable("data.event_id", d.EventID, 255-len(event.VoidSuffix), false); err != nil {
		return nil, err
	}
	if ce.ID != d.EventID+event.VoidSuffix {
		return nil, fmt.Errorf("id %q: want data.event_id + %q", ce.ID, event.VoidSuffix)
	}
	if err := printable("data.attempt", d.Attempt, 255, false); err != nil {
		return nil, err
	}
	if d.Reason != event.VoidUnavailable && d.Reason != event.VoidCallerGone {
		return nil, fmt.Errorf("data.reason %q: want %s or %s", d.Reason, event.VoidUnavailable, event.VoidCallerGone)
	}
	return &voidRow{EventID: d.EventID, Attempt: d.Attempt, Reason: d.Reason, VoidTime: eventTime(ce), Source: ce.Source}, nil
}

// alertKinds are the kinds of alert rules (policy.AlertKind), as usage_alerts checks them.
var alertKinds = map[string]bool{"quota_percent": true, "balance_below": true, "balance_percent": true}

func parseThreshold(ce event.CloudEvent, d *event.Threshold, value []byte) (*alertRow, error) {
	if err := printable("data.org", d.Org, 255, false); err != nil {
		return nil, err
	}
	if len(d.Path) == 0 || d.Path[0].Account != d.Org || d.Path[len(d.Path)-1].Account != d.Account {
		return nil, errors.New("data.path: want the org first and data.account last")
	}
	path := make([]string, len(d.Path))
	for i, n := range d.Path {
		if err := printable("data.path.account", n.Account, 255, false); err != nil {
			return nil, err
		}
		path[i] = n.Account
	}
	if !policy.Unit(d.Unit).Valid() {
		return nil, fmt.Errorf("data.unit %q: unknown unit", d.Unit)
	}
	if !alertKinds[d.Kind] {
		return nil, fmt.Errorf("data.kind %q: want quota_percent, balance_below or balance_percent", d.Kind)
	}
	if d.Threshold <= 0 || d.At <= 0 || d.Value < 0 {
		return nil, fmt.Errorf("data.threshold %d, at %d, value %d: want positive, positive, at least 0", d.Threshold, d.At, d.Value)
	}
	if _, err := period.Parse(d.Period); err != nil {
		return nil, fmt.Errorf("data.period %q: %w", d.Period, err)
	}
	if (d.Kind == "quota_percent") != (d.Grant == "") || d.Grant != "" && !event.ValidGrantID(d.Grant) {
		return nil, fmt.Errorf("data.grant %q: a balance's threshold names its grant, a quota's none", d.Grant)
	}
	if err := printable("data.event_id", d.EventID, 255, false); err != nil {
		return nil, err
	}
	if !json.Valid(value) {
		return nil, errors.New("not valid JSON")
	}
	return &alertRow{ID: ce.ID, EventTime: eventTime(ce), Org: d.Org, Account: d.Account, Path: path, Unit: d.Unit,
		Kind: d.Kind, Threshold: d.Threshold, At: d.At, Value: d.Value, Period: d.Period, Grant: d.Grant,
		TriggeredBy: d.EventID, Admitted: d.Admitted, Payload: bytes.Clone(value)}, nil
}

// printable checks an identifier: printable ASCII without spaces, at most maxLen bytes.
func printable(field, s string, maxLen int, optional bool) error {
	if s == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%s: missing", field)
	}
	if len(s) > maxLen {
		return fmt.Errorf("%s: longer than %d bytes", field, maxLen)
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return fmt.Errorf("%s %q: want printable ASCII without spaces", field, s)
		}
	}
	return nil
}

// text checks free text: valid UTF-8 without control characters (PostgreSQL text cannot
// hold NUL), at most maxLen bytes.
func text(field, s string, maxLen int, optional bool) error {
	if s == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%s: missing", field)
	}
	if len(s) > maxLen {
		return fmt.Errorf("%s: longer than %d bytes", field, maxLen)
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("%s %q: want UTF-8 text without control characters", field, s)
	}
	return nil
}
