package policy

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/credential"
	"github.com/metergate/metergate/internal/invoice"
)

// Errors of the store and the cache; check them with errors.Is.
var (
	// ErrNotFound: the account, API key or plan does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: an account or plan with that id exists already.
	ErrExists = errors.New("already exists")
	// ErrRevoked: the API key exists but was revoked.
	ErrRevoked = errors.New("api key revoked")
)

// InvalidError is returned (possibly wrapped) for every input the store refuses, so the
// HTTP layer can answer 400 with a code derived from Field.
type InvalidError struct {
	// Field is the input at fault: id, kind, parent, org, plan, limits, concurrency,
	// priority, rank, or price.<field> (price.currency, price.effective_period, ...).
	Field   string
	Message string
}

// Error returns "field: message".
func (e *InvalidError) Error() string { return e.Field + ": " + e.Message }

func invalid(field, format string, args ...any) *InvalidError {
	return &InvalidError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Plan is a tier: the limits and concurrency cap of the accounts that name it. The plan
// with the lowest Rank is the smallest, what unknown or missing plans clamp to.
type Plan struct {
	ID          string         `json:"id"`
	Rank        int            `json:"rank"`
	Limits      map[Unit]Limit `json:"limits"`
	Concurrency int            `json:"concurrency"`
	// Priority is the waiting priority of the plan's orgs (0-100, higher first; see
	// Resolved.Priority).
	Priority int `json:"priority"`
	// Grants are the plan's recurring credit grants, per unit: every account naming the
	// plan gets Amount units each month, expiring at its end (reconcile issues them;
	// docs/credits.md).
	Grants map[Unit]PlanGrant `json:"grants,omitempty"`
	// Shadow decides and records the requests of the accounts on the plan (and below them)
	// but never refuses them (docs/admission.md, "Shadow mode").
	Shadow bool `json:"shadow,omitempty"`
	// Prices are the versions of the plan's price, oldest first (the store's reads fill
	// them in; the cache does not: admit does not price).
	Prices []invoice.Plan `json:"-"`
	// alerts are the plan's default alert rules (the cache fills them in).
	alerts []Alert
}

// PlanGrant is a plan's recurring grant of one unit.
type PlanGrant struct {
	Amount   int64 `json:"amount"`
	Priority int   `json:"priority"`
}

// Account is one node of the account tree as stored: its own plan, overrides and
// concurrency, not the effective policy (see Cache.Resolve for that).
type Account struct {
	ID     string `json:"id"`
	Kind   Kind   `json:"kind"`
	Parent string `json:"parent"`
	// Org is the root of the node's tree (the node itself for an org); the store sets it.
	Org  string `json:"org"`
	Plan string `json:"plan,omitempty"`
	// Limits are the node's overrides, normalized.
	Limits map[Unit]Limit `json:"limits,omitempty"`
	// Concurrency is the node's own cap; nil means its plan's (if it names one), else none.
	Concurrency *int `json:"concurrency,omitempty"`
	// Priority is the node's waiting priority (0-100, higher first); nil means its
	// parent's, up to its org's plan's (see Resolved.Priority).
	Priority *int `json:"priority,omitempty"`
	// Shadow decides and records the node's requests, and those of the nodes below it, but
	// never refuses them (docs/admission.md, "Shadow mode").
	Shadow    bool      `json:"shadow,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// APIKey is an end-customer key of one account node. The secret is not part of it: only
// its SHA-256 is stored, and it is shown once, by CreateAPIKey.
type APIKey struct {
	ID        string     `json:"id"`
	Account   string     `json:"account"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// SecretPrefix starts every API key secret, so a leaked key is recognisable (secret
// scanners) and a key is not mistaken for an account id.
const SecretPrefix = "mgk_"

// HashKey is how an API key secret is stored and looked up: its SHA-256. The secret has
// 256 random bits, so a plain (unsalted, fast) hash is enough.
func HashKey(secret string) []byte { return credential.Hash(secret) }

// Store writes and reads policies in PostgreSQL, the source of truth. It validates every
// write; the database's constraints repeat the checks for rows written by hand.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a store over pool, whose schema has the migrations applied.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// The statements of CreateAccount.
var (
	//go:embed sql/read_parent.sql
	readParentSQL string
	//go:embed sql/insert_account.sql
	insertAccountSQL string
)

// CreateAccount creates a node of the account tree and returns it as stored, with Org set
// from its parent's. It returns an *InvalidError for bad input, including a parent that does
// not exist (a 400 for the caller, not a 404: the missing thing is part of the input), and
// ErrExists if the id is taken.
func (s *Store) CreateAccount(ctx context.Context, a Account) (Account, error) {
	if !ValidID(a.ID) {
		return Account{}, invalid("id", "must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	if a.Kind.Depth() < 0 {
		return Account{}, invalid("kind", "unknown kind %q (want org, team, user or agent)", a.Kind)
	}
	if a.Kind == Org {
		if a.Parent != "" {
			return Account{}, invalid("parent", "an org has no parent")
		}
		if a.Org != "" && a.Org != a.ID {
			return Account{}, invalid("org", "an org is its own org")
		}
	} else {
		if a.Parent == "" {
			return Account{}, invalid("parent", "a %s needs a parent", a.Kind)
		}
		if !ValidID(a.Parent) {
			return Account{}, invalid("parent", "account %q does not exist", a.Parent)
		}
	}
	limits, err := checkOverrides(a)
	if err != nil {
		return Account{}, err
	}
	if a.Kind == Org {
		if err := checkOrgOverrides(limits); err != nil {
			return Account{}, err
		}
	}
	a.Limits = limits

	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := checkPlan(ctx, tx, a.Plan); err != nil {
			return err
		}
		org := a.ID
		if a.Kind != Org {
			var (
				parentKind Kind
				parentOrg  string
			)
			// Key-share locked (read_parent.sql): the parent cannot go away before this insert commits.
			err := tx.QueryRow(ctx, readParentSQL, pgx.StrictNamedArgs{"id": a.Parent}).Scan(&parentKind, &parentOrg)
			if errors.Is(err, pgx.ErrNoRows) {
				return invalid("parent", "account %q does not exist", a.Parent)
			}
			if err != nil {
				return fmt.Errorf("read parent %q: %w", a.Parent, err)
			}
			if parentKind.Depth() >= a.Kind.Depth() {
				return invalid("parent", "a %s cannot be under a %s (the tree is org → team → user → agent)", a.Kind, parentKind)
			}
			if a.Org != "" && a.Org != parentOrg {
				return invalid("org", "the parent's org is %q", parentOrg)
			}
			org = parentOrg
		}
		a.Org = org
		var parent *string
		if a.Parent != "" {
			parent = &a.Parent
		}
		err := tx.QueryRow(ctx, insertAccountSQL, pgx.StrictNamedArgs{
			"id": a.ID, "kind": string(a.Kind), "parent": parent, "org": a.Org, "plan": nullString(a.Plan),
			"concurrency": a.Concurrency, "priority": a.Priority, "shadow": a.Shadow,
		}).Scan(&a.CreatedAt, &a.UpdatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("account %q: %w", a.ID, ErrExists)
		}
		if err != nil {
			return fmt.Errorf("insert account %q: %w", a.ID, err)
		}
		return insertOverrides(ctx, tx, a.ID, a.Limits)
	})
	if err != nil {
		return Account{}, dbError(err)
	}
	return a, nil
}

//go:embed sql/update_account.sql
var updateAccountSQL string

// UpdateAccount replaces the plan, overrides, concurrency and priority of an existing
// account and returns it as stored. Kind and parent cannot change: an *InvalidError if a differs in
// them (empty means "unchanged"). ErrNotFound if the account does not exist.
func (s *Store) UpdateAccount(ctx context.Context, a Account) (Account, error) {
	if !ValidID(a.ID) {
		return Account{}, fmt.Errorf("account %q: %w", a.ID, ErrNotFound)
	}
	if a.Kind != "" && a.Kind.Depth() < 0 {
		return Account{}, invalid("kind", "unknown kind %q (want org, team, user or agent)", a.Kind)
	}
	limits, err := checkOverrides(a)
	if err != nil {
		return Account{}, err
	}
	var out Account
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		cur, err := getAccount(ctx, tx, a.ID, true)
		if err != nil {
			return err
		}
		if a.Kind != "" && a.Kind != cur.Kind {
			return invalid("kind", "cannot change from %s to %s: create a new account", cur.Kind, a.Kind)
		}
		if a.Parent != "" && a.Parent != cur.Parent {
			return invalid("parent", "cannot move the account from %q to %q: create a new account", cur.Parent, a.Parent)
		}
		if a.Org != "" && a.Org != cur.Org {
			return invalid("org", "cannot change from %q to %q", cur.Org, a.Org)
		}
		if cur.Kind == Org {
			if err := checkOrgOverrides(limits); err != nil {
				return err
			}
		}
		if err := checkPlan(ctx, tx, a.Plan); err != nil {
			return err
		}
		out = cur
		out.Plan, out.Limits, out.Concurrency, out.Priority, out.Shadow = a.Plan, limits, a.Concurrency, a.Priority, a.Shadow
		err = tx.QueryRow(ctx, updateAccountSQL, pgx.StrictNamedArgs{
			"id": a.ID, "plan": nullString(a.Plan), "concurrency": a.Concurrency, "priority": a.Priority, "shadow": a.Shadow,
		}).Scan(&out.UpdatedAt)
		if err != nil {
			return fmt.Errorf("update account %q: %w", a.ID, err)
		}
		if _, err := tx.Exec(ctx, `delete from account_limits where account = @account`, pgx.StrictNamedArgs{"account": a.ID}); err != nil {
			return fmt.Errorf("delete overrides of %q: %w", a.ID, err)
		}
		return insertOverrides(ctx, tx, a.ID, limits)
	})
	if err != nil {
		return Account{}, dbError(err)
	}
	return out, nil
}

// GetAccount returns an account as stored (its own plan, overrides, concurrency and
// priority), or ErrNotFound.
func (s *Store) GetAccount(ctx context.Context, id string) (Account, error) {
	if !ValidID(id) {
		return Account{}, fmt.Errorf("account %q: %w", id, ErrNotFound)
	}
	var a Account
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		a, err = getAccount(ctx, tx, id, false)
		return err
	})
	return a, err
}

// Plans returns every plan, smallest first, with its price versions.
func (s *Store) Plans(ctx context.Context) ([]Plan, error) {
	var plans []Plan
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		byID, err := loadPlans(ctx, tx)
		if err != nil {
			return err
		}
		prices, err := invoice.PriceVersions(ctx, tx, "")
		if err != nil {
			return err
		}
		for _, v := range prices {
			if p, ok := byID[v.ID]; ok {
				p.Prices = append(p.Prices, v)
			}
		}
		for _, p := range byID {
			plans = append(plans, *p)
		}
		return nil
	})
	sort.Slice(plans, func(i, j int) bool { return plans[i].Rank < plans[j].Rank })
	return plans, err
}

// GetPlan returns a plan with its limits and price versions, or ErrNotFound.
func (s *Store) GetPlan(ctx context.Context, id string) (Plan, error) {
	if !ValidID(id) {
		return Plan{}, fmt.Errorf("plan %q: %w", id, ErrNotFound)
	}
	var p Plan
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		p, err = getPlan(ctx, tx, id)
		return err
	})
	return p, err
}

//go:embed sql/insert_plan.sql
var insertPlanSQL string

// CreatePlan creates a plan (id, rank, limits, concurrency, priority) and, when price is
// not nil, the first version of its price, which prices every period (its EffectivePeriod
// must be zero). It returns the plan as stored, an *InvalidError for bad input (a rank
// another plan has included), or ErrExists if the id is taken. Like every plan write it
// notifies the admit caches (the triggers of plans and plan_limits).
//
// The plan with the lowest rank is the smallest, what unknown plans clamp to and are billed
// on: it must have a price.
func (s *Store) CreatePlan(ctx context.Context, p Plan, price *invoice.Plan) (Plan, error) {
	if !ValidID(p.ID) {
		return Plan{}, invalid("id", "must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
	}
	limits, err := checkPlanFields(p)
	if err != nil {
		return Plan{}, err
	}
	if err := checkPriceBounds(price); err != nil {
		return Plan{}, err
	}
	var out Plan
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if err := checkRank(ctx, tx, p); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, insertPlanSQL, pgx.StrictNamedArgs{
			"id": p.ID, "rank": p.Rank, "concurrency": p.Concurrency, "priority": p.Priority, "shadow": p.Shadow,
		})
		if err != nil {
			return fmt.Errorf("insert plan %q: %w", p.ID, err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("plan %q: %w", p.ID, ErrExists)
		}
		if err := writePlanRest(ctx, tx, p.ID, limits, p.Grants, price); err != nil {
			return err
		}
		out, err = getPlan(ctx, tx, p.ID)
		return err
	})
	if err != nil {
		return Plan{}, planDBError(err)
	}
	return out, nil
}

// The statements of UpdatePlan.
var (
	//go:embed sql/lock_plan.sql
	lockPlanSQL string
	//go:embed sql/update_plan.sql
	updatePlanSQL string
)

// UpdatePlan replaces the rank, limits, concurrency and priority of an existing plan and,
// when price is not nil, adds a version of its price (invoice.AddPriceVersion: effective
// after the last closed period; versions are never rewritten, so issued invoices keep
// theirs). It returns the plan as stored, an *InvalidError for bad input, or ErrNotFound.
// The admit caches reload the plan's limits within a second, as for accounts.
func (s *Store) UpdatePlan(ctx context.Context, p Plan, price *invoice.Plan) (Plan, error) {
	if !ValidID(p.ID) {
		return Plan{}, fmt.Errorf("plan %q: %w", p.ID, ErrNotFound)
	}
	limits, err := checkPlanFields(p)
	if err != nil {
		return Plan{}, err
	}
	if err := checkPriceBounds(price); err != nil {
		return Plan{}, err
	}
	var out Plan
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, lockPlanSQL, pgx.StrictNamedArgs{"id": p.ID}).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("plan %q: %w", p.ID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("read plan %q: %w", p.ID, err)
		}
		if err := checkRank(ctx, tx, p); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, updatePlanSQL, pgx.StrictNamedArgs{
			"id": p.ID, "rank": p.Rank, "concurrency": p.Concurrency, "priority": p.Priority, "shadow": p.Shadow,
		}); err != nil {
			return fmt.Errorf("update plan %q: %w", p.ID, err)
		}
		if _, err := tx.Exec(ctx, `delete from plan_limits where plan = @plan`, pgx.StrictNamedArgs{"plan": p.ID}); err != nil {
			return fmt.Errorf("delete limits of plan %q: %w", p.ID, err)
		}
		if err := writePlanRest(ctx, tx, p.ID, limits, p.Grants, price); err != nil {
			return err
		}
		out, err = getPlan(ctx, tx, p.ID)
		return err
	})
	if err != nil {
		return Plan{}, planDBError(err)
	}
	return out, nil
}

// checkPlanFields validates a plan's rank, concurrency, priority and limits (each with
// Limit.Validate, ceiling included) and returns the limits normalized.
func checkPlanFields(p Plan) (map[Unit]Limit, error) {
	// The columns are integers: larger values would fail in the driver, not as bad input.
	if p.Rank < math.MinInt32 || p.Rank > math.MaxInt32 {
		return nil, invalid("rank", "must be %d to %d", math.MinInt32, math.MaxInt32)
	}
	if p.Concurrency < 0 || p.Concurrency > math.MaxInt32 {
		return nil, invalid("concurrency", "must be 0 (no cap) to %d", math.MaxInt32)
	}
	if p.Priority < 0 || p.Priority > 100 { // as the plans_priority constraint
		return nil, invalid("priority", "must be 0 to 100 (higher waits first)")
	}
	for _, u := range sortedUnits(p.Grants) {
		g := p.Grants[u]
		switch {
		case !u.Valid():
			return nil, invalid("grants", "unknown unit %q (want requests, tokens, credits or cost_micros)", u)
		case g.Amount <= 0 || g.Amount > MaxAmount:
			return nil, invalid("grants", "%s: amount must be 1 to %d", u, int64(MaxAmount))
		case g.Priority < 0 || g.Priority > 100:
			return nil, invalid("grants", "%s: priority must be 0 to 100", u)
		}
	}
	out := make(map[Unit]Limit, len(p.Limits))
	for _, u := range sortedUnits(p.Limits) {
		if !u.Valid() {
			return nil, invalid("limits", "unknown unit %q (want requests, tokens, credits or cost_micros)", u)
		}
		l := p.Limits[u].Normalize()
		if err := checkLimit(l); err != nil {
			return nil, invalid("limits", "%s: %s", u, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		out[u] = l
	}
	return out, nil
}

// checkPriceBounds refuses an amount or count of a price version past MaxAmount, naming it
// as the API's body does (price.base_fee_minor, price.units.tokens.tiers[1].price_minor);
// the pricing rules themselves are invoice.Plan.Validate's.
func checkPriceBounds(p *invoice.Plan) error {
	if p == nil {
		return nil
	}
	if p.BaseFeeMinor > MaxAmount {
		return invalid("price.base_fee_minor", "price.base_fee_minor must be at most %d", int64(MaxAmount))
	}
	for _, up := range p.Units {
		if up.Included > MaxAmount {
			return invalid("price.units", "price.units.%s.included must be at most %d", up.Unit, int64(MaxAmount))
		}
		for i, t := range up.Tiers {
			for _, f := range []struct {
				name string
				v    int64
			}{{"from", t.From}, {"up_to", t.UpTo}, {"price_minor", t.PriceMinor}, {"per_units", t.PerUnits}} {
				if f.v > MaxAmount {
					return invalid("price.units", "price.units.%s.tiers[%d].%s must be at most %d", up.Unit, i, f.name, int64(MaxAmount))
				}
			}
		}
	}
	return nil
}

//go:embed sql/plan_with_rank.sql
var planWithRankSQL string

// checkRank refuses a rank another plan has: ranks order the plans, the lowest is the
// smallest.
func checkRank(ctx context.Context, tx pgx.Tx, p Plan) error {
	var other string
	err := tx.QueryRow(ctx, planWithRankSQL, pgx.StrictNamedArgs{"rank": p.Rank, "id": p.ID}).Scan(&other)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("read ranks: %w", err)
	}
	return invalid("rank", "rank %d is plan %q's: ranks are unique (the lowest is the smallest plan)", p.Rank, other)
}

// The statements of writePlanRest.
var (
	//go:embed sql/insert_plan_grant.sql
	insertPlanGrantSQL string
	//go:embed sql/insert_plan_limit.sql
	insertPlanLimitSQL string
	//go:embed sql/smallest_plan.sql
	smallestPlanSQL string
)

// writePlanRest writes a plan's limits and, if any, a price version, then checks that the
// smallest plan has a price (invoices of orgs on unknown or unpriced plans use it).
func writePlanRest(ctx context.Context, tx pgx.Tx, plan string, limits map[Unit]Limit, grants map[Unit]PlanGrant, price *invoice.Plan) error {
	if _, err := tx.Exec(ctx, `delete from plan_grants where plan = @plan`, pgx.StrictNamedArgs{"plan": plan}); err != nil {
		return fmt.Errorf("delete grants of plan %q: %w", plan, err)
	}
	for _, u := range sortedUnits(grants) {
		g := grants[u]
		if _, err := tx.Exec(ctx, insertPlanGrantSQL, pgx.StrictNamedArgs{
			"plan": plan, "unit": string(u), "amount": g.Amount, "priority": g.Priority,
		}); err != nil {
			return fmt.Errorf("insert grant %s of plan %q: %w", u, plan, err)
		}
	}
	for _, u := range sortedUnits(limits) {
		args := limitArgs(u, limits[u])
		args["plan"] = plan
		if _, err := tx.Exec(ctx, insertPlanLimitSQL, args); err != nil {
			return fmt.Errorf("insert limit %s of plan %q: %w", u, plan, err)
		}
	}
	if price != nil {
		pr := *price
		pr.ID = plan
		if _, err := invoice.AddPriceVersion(ctx, tx, pr); err != nil {
			var inv *invoice.InvalidPriceError
			if errors.As(err, &inv) {
				return invalid("price."+inv.Field, "%s", inv.Message)
			}
			return err
		}
	}
	var (
		smallest string
		priced   bool
	)
	if err := tx.QueryRow(ctx, smallestPlanSQL).Scan(&smallest, &priced); err != nil {
		return fmt.Errorf("read the smallest plan: %w", err)
	}
	if smallest == plan && !priced {
		return invalid("price", "plan %q would be the smallest (lowest rank), which unknown plans are billed on: it needs a price", plan)
	}
	return nil
}

// The statements of getPlan.
var (
	//go:embed sql/read_plan.sql
	readPlanSQL string
	//go:embed sql/read_plan_limits.sql
	readPlanLimitsSQL string
	//go:embed sql/read_plan_grants.sql
	readPlanGrantsSQL string
)

// getPlan reads one plan with its limits and price versions.
func getPlan(ctx context.Context, tx pgx.Tx, id string) (Plan, error) {
	p := Plan{ID: id, Limits: make(map[Unit]Limit)}
	err := tx.QueryRow(ctx, readPlanSQL, pgx.StrictNamedArgs{"id": id}).Scan(&p.Rank, &p.Concurrency, &p.Priority, &p.Shadow)
	if errors.Is(err, pgx.ErrNoRows) {
		return Plan{}, fmt.Errorf("plan %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Plan{}, fmt.Errorf("read plan %q: %w", id, err)
	}
	limits, err := readLimits(ctx, tx, readPlanLimitsSQL, pgx.StrictNamedArgs{"plan": id})
	if err != nil {
		return Plan{}, fmt.Errorf("read limits of plan %q: %w", id, err)
	}
	if limits != nil {
		p.Limits = limits
	}
	if p.Prices, err = invoice.PriceVersions(ctx, tx, id); err != nil {
		return Plan{}, err
	}
	grows, err := tx.Query(ctx, readPlanGrantsSQL, pgx.StrictNamedArgs{"plan": id})
	if err != nil {
		return Plan{}, fmt.Errorf("read grants of plan %q: %w", id, err)
	}
	defer grows.Close()
	for grows.Next() {
		var (
			u Unit
			g PlanGrant
		)
		if err := grows.Scan(&u, &g.Amount, &g.Priority); err != nil {
			return Plan{}, fmt.Errorf("read grants of plan %q: %w", id, err)
		}
		if p.Grants == nil {
			p.Grants = map[Unit]PlanGrant{}
		}
		p.Grants[u] = g
	}
	if err := grows.Err(); err != nil {
		return Plan{}, fmt.Errorf("read grants of plan %q: %w", id, err)
	}
	return p, nil
}

// planDBError is dbError for plan writes: a constraint the checks above should have
// caught (a rank taken by a concurrent write included) is bad input, not an outage.
func planDBError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.ConstraintName == "plans_rank_key":
		return fmt.Errorf("%w (%w)", invalid("rank", "rank taken by another plan"), err)
	case pgErr.ConstraintName == "plans_priority":
		return fmt.Errorf("%w (%w)", invalid("priority", "%s", pgErr.Message), err)
	case strings.HasPrefix(pgErr.ConstraintName, "plan_limits"):
		return fmt.Errorf("%w (%w)", invalid("limits", "%s", pgErr.Message), err)
	case strings.HasPrefix(pgErr.ConstraintName, "plan_price"):
		return fmt.Errorf("%w (%w)", invalid("price", "%s", pgErr.Message), err)
	case pgErr.Code == "23514", pgErr.Code == "22003":
		return fmt.Errorf("%w (%w)", invalid("plan", "%s", pgErr.Message), err)
	}
	return err
}

//go:embed sql/insert_api_key.sql
var insertAPIKeySQL string

// CreateAPIKey makes a key for an existing account and returns it with its secret, which
// is not stored (only its hash) and cannot be shown again. ErrNotFound if the account does
// not exist.
func (s *Store) CreateAPIKey(ctx context.Context, account string) (APIKey, string, error) {
	if !ValidID(account) {
		return APIKey{}, "", fmt.Errorf("account %q: %w", account, ErrNotFound)
	}
	id, secret := credential.New("key_", SecretPrefix)
	key := APIKey{ID: id, Account: account}
	err := s.pool.QueryRow(ctx, insertAPIKeySQL, pgx.StrictNamedArgs{
		"id": key.ID, "account": account, "hash": HashKey(secret),
	}).Scan(&key.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, "", fmt.Errorf("account %q: %w", account, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, "", fmt.Errorf("insert api key: %w", err)
	}
	return key, secret, nil
}

//go:embed sql/revoke_api_key.sql
var revokeAPIKeySQL string

// RevokeAPIKey revokes a key for good; revoking it again keeps the first revocation time.
// ErrNotFound if there is no such key.
func (s *Store) RevokeAPIKey(ctx context.Context, id string) error {
	if !ValidID(id) { // key ids are ids; anything else (a NUL, invalid UTF-8) names no key
		return fmt.Errorf("api key %q: %w", id, ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, revokeAPIKeySQL, pgx.StrictNamedArgs{"id": id})
	if err != nil {
		return fmt.Errorf("revoke api key %q: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("api key %q: %w", id, ErrNotFound)
	}
	return nil
}

// checkOverrides validates what a write may set besides the tree position: concurrency,
// priority and the override of each unit, which it returns normalized (each checked with
// Limit.Validate, ceiling included).
func checkOverrides(a Account) (map[Unit]Limit, error) {
	// The column is an integer: a larger cap would fail in PostgreSQL's driver, not as bad input.
	if a.Concurrency != nil && (*a.Concurrency < 0 || *a.Concurrency > math.MaxInt32) {
		return nil, invalid("concurrency", "must be 0 (no cap) to %d", math.MaxInt32)
	}
	if a.Priority != nil && (*a.Priority < 0 || *a.Priority > 100) { // as the accounts_priority constraint
		return nil, invalid("priority", "must be 0 to 100 (higher waits first), or left out for the parent's")
	}
	if a.Plan != "" && !ValidID(a.Plan) {
		return nil, invalid("plan", "unknown plan %q", a.Plan)
	}
	if len(a.Limits) == 0 {
		return nil, nil
	}
	out := make(map[Unit]Limit, len(a.Limits))
	for _, u := range sortedUnits(a.Limits) {
		if !u.Valid() {
			return nil, invalid("limits", "unknown unit %q (want requests, tokens, credits or cost_micros)", u)
		}
		l := a.Limits[u].Normalize()
		if err := checkLimit(l); err != nil {
			// errors.Join puts one problem per line; a message reads better on one.
			return nil, invalid("limits", "%s: %s", u, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		out[u] = l
	}
	return out, nil
}

// checkOrgOverrides refuses what an org's overrides cannot hold: a ceiling, which borrows
// from the parent.
func checkOrgOverrides(limits map[Unit]Limit) error {
	for _, u := range sortedUnits(limits) {
		if limits[u].Ceiling != 0 {
			return invalid("limits", "%s: an org cannot have a ceiling: an org has no parent to borrow from", u)
		}
	}
	return nil
}

// checkLimit is Limit.Validate plus what the table constraints refuse beyond it: forms
// that are ambiguous or say nothing.
func checkLimit(l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if math.IsNaN(l.RatePerS) || math.IsInf(l.RatePerS, 0) {
		return errors.New("rate_per_s must be a finite number")
	}
	if l.Limit < 0 || l.WindowS < 0 {
		return errors.New("limit and window_s must not be negative")
	}
	switch l.Algorithm {
	case TokenBucket:
		if (l.Limit > 0) != (l.WindowS > 0) {
			return errors.New("limit and window_s go together")
		}
		// Normalize wrote Burst and RatePerS from Limit per WindowS unless they were given
		// too: then they must say the same thing, or the bucket would be ambiguous.
		if l.Limit > 0 && (l.Burst != l.Limit || l.RatePerS != float64(l.Limit)/float64(l.WindowS)) {
			return errors.New("give either rate_per_s and burst or limit and window_s, not both")
		}
	case SlidingWindow:
		if l.RatePerS != 0 || l.Burst != 0 {
			return errors.New("rate_per_s and burst are for token_bucket; a sliding window takes limit and window_s")
		}
	}
	if l.QuotaPeriod != "" && l.Quota == nil {
		return errors.New("quota_period needs a quota")
	}
	if !l.HasRate() && l.Quota == nil {
		return errors.New("sets neither a rate nor a quota (leave the unit out instead)")
	}
	return nil
}

func sortedUnits[V any](m map[Unit]V) []Unit {
	us := make([]Unit, 0, len(m))
	for u := range m {
		us = append(us, u)
	}
	sort.Slice(us, func(i, j int) bool { return us[i] < us[j] })
	return us
}

//go:embed sql/read_plan_ids.sql
var readPlanIDsSQL string

func checkPlan(ctx context.Context, tx pgx.Tx, plan string) error {
	if plan == "" {
		return nil
	}
	var known []string
	err := tx.QueryRow(ctx, readPlanIDsSQL).Scan(&known)
	if err != nil {
		return fmt.Errorf("read plans: %w", err)
	}
	for _, k := range known {
		if k == plan {
			return nil
		}
	}
	return invalid("plan", "unknown plan %q (known: %s)", plan, strings.Join(known, ", "))
}

//go:embed sql/insert_account_limit.sql
var insertAccountLimitSQL string

func insertOverrides(ctx context.Context, tx pgx.Tx, account string, limits map[Unit]Limit) error {
	for _, u := range sortedUnits(limits) {
		args := limitArgs(u, limits[u])
		args["account"] = account
		if _, err := tx.Exec(ctx, insertAccountLimitSQL, args); err != nil {
			return fmt.Errorf("insert override %s of %q: %w", u, account, err)
		}
	}
	return nil
}

// The statements of getAccount: reading an account, or reading and locking it, are two
// queries chosen in Go.
var (
	//go:embed sql/read_account.sql
	readAccountSQL string
	//go:embed sql/lock_account.sql
	lockAccountSQL string
	//go:embed sql/read_account_limits.sql
	readAccountLimitsSQL string
)

func getAccount(ctx context.Context, tx pgx.Tx, id string, forUpdate bool) (Account, error) {
	q := readAccountSQL
	if forUpdate {
		q = lockAccountSQL
	}
	var a Account
	err := tx.QueryRow(ctx, q, pgx.StrictNamedArgs{"id": id}).Scan(&a.ID, &a.Kind, &a.Parent, &a.Org, &a.Plan, &a.Concurrency, &a.Priority, &a.Shadow, &a.CreatedAt, &a.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, fmt.Errorf("account %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Account{}, fmt.Errorf("read account %q: %w", id, err)
	}
	if a.Limits, err = readLimits(ctx, tx, readAccountLimitsSQL, pgx.StrictNamedArgs{"account": id}); err != nil {
		return Account{}, fmt.Errorf("read overrides of %q: %w", id, err)
	}
	return a, nil
}

// readLimits reads the limits of one plan or account: query (read_plan_limits.sql or
// read_account_limits.sql) selects the unit and the limit's columns of its rows. nil when
// it has none.
func readLimits(ctx context.Context, tx pgx.Tx, query string, args pgx.StrictNamedArgs) (map[Unit]Limit, error) {
	rows, err := tx.Query(ctx, query, args)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out map[Unit]Limit
	for rows.Next() {
		var (
			u Unit
			l limitRow
		)
		if err := rows.Scan(append([]any{&u}, l.dest()...)...); err != nil {
			return nil, err
		}
		if out == nil {
			out = make(map[Unit]Limit)
		}
		out[u] = l.toLimit()
	}
	return out, rows.Err()
}

// limitRow is a limit as scanned from the database.
type limitRow struct {
	algorithm   string
	ratePerS    float64
	burst       int64
	limit       int64
	windowS     int64
	quota       *int64
	quotaPeriod *string
	ceiling     int64
}

// dest returns where to scan a limit's columns of plan_limits or account_limits, which every
// query reading limits selects in this order: algorithm, rate_per_s, burst, "limit",
// window_s, quota, quota_period, ceiling.
func (r *limitRow) dest() []any {
	return []any{&r.algorithm, &r.ratePerS, &r.burst, &r.limit, &r.windowS, &r.quota, &r.quotaPeriod, &r.ceiling}
}

func (r *limitRow) toLimit() Limit {
	l := Limit{Algorithm: Algorithm(r.algorithm), RatePerS: r.ratePerS, Burst: r.burst, Limit: r.limit, WindowS: r.windowS, Quota: r.quota, Ceiling: r.ceiling}
	if r.quotaPeriod != nil {
		l.QuotaPeriod = QuotaPeriod(*r.quotaPeriod)
	}
	return l.Normalize()
}

// limitArgs are the arguments of limit l of unit u in insert_plan_limit.sql and
// insert_account_limit.sql; the caller adds the plan or the account.
func limitArgs(u Unit, l Limit) pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{
		"unit": string(u), "algorithm": string(l.Algorithm), "rate_per_s": l.RatePerS, "burst": l.Burst,
		"limit": l.Limit, "window_s": l.WindowS, "quota": l.Quota, "quota_period": nullString(string(l.QuotaPeriod)),
		"ceiling": l.Ceiling,
	}
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// dbError turns a constraint the database refused, which the store's own checks should have
// caught, into an *InvalidError: bad input must never look like an outage to the caller.
func dbError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "23514", "23502", "22001", "22003": // check, not null, too long, out of range
		field := "account"
		switch {
		case strings.HasPrefix(pgErr.ConstraintName, "account_limits"):
			field = "limits"
		case pgErr.ConstraintName == "accounts_priority":
			field = "priority"
		}
		return fmt.Errorf("%w (%w)", invalid(field, "%s", pgErr.Message), err)
	case "23503": // a parent or plan that went away while the write ran
		return fmt.Errorf("%w (%w)", invalid("parent", "%s", pgErr.Message), err)
	case "23505":
		return fmt.Errorf("%w (%w)", ErrExists, err)
	}
	return err
}
