package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"time"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
)

// account is one node of the demo's account tree, as POST /v1/admin/accounts takes it.
type account struct {
	ID          string         `json:"id"`
	Kind        string         `json:"kind"`
	Parent      string         `json:"parent,omitempty"`
	Plan        string         `json:"plan,omitempty"`
	Limits      map[string]any `json:"limits,omitempty"`
	Concurrency int            `json:"concurrency,omitempty"`
	Priority    int            `json:"priority,omitempty"`
	// key: an API key is issued for this account (the traffic uses it).
	key bool
	// note is shown beside the account's limits.
	note string
}

// teamPlan is a plan the demo adds through the admin API so that half a minute of traffic
// goes past what the base fee includes and acme's invoice shows overage priced by
// graduated tiers (the seeded plans include millions of units).
const teamPlan = "team"

const teamPlanSummary = "EUR 19.00 a month with 200 requests and 100,000 tokens included, then graduated tiers"

// teamPlanBody is teamPlan as POST /v1/admin/plans takes it: pro's rate limits (100
// requests/s, burst 300, 5,000,000 a month), a base fee, small included units and two
// graduated tiers per unit.
func teamPlanBody() map[string]any {
	tier := func(from, upTo, price, per int64) map[string]any {
		t := map[string]any{"from": from, "price_minor": price, "per_units": per}
		if upTo > 0 {
			t["up_to"] = upTo
		}
		return t
	}
	return map[string]any{
		"id": teamPlan, "rank": 10,
		"limits": map[string]any{
			"requests": map[string]any{"rate_per_s": 100, "burst": 300, "quota": 5_000_000, "quota_period": "month"},
		},
		"price": map[string]any{
			"currency": "EUR", "base_fee_minor": 1900,
			"units": map[string]any{
				"requests": map[string]any{"included": 200, "tiers": []any{
					tier(200, 1000, 100, 100), // EUR 1.00 per 100 requests
					tier(1000, 0, 50, 100),    // then EUR 0.50 per 100
				}},
				"tokens": map[string]any{"included": 100_000, "tiers": []any{
					tier(100_000, 1_000_000, 20, 10_000), // EUR 0.20 per 10,000 tokens
					tier(1_000_000, 0, 10, 10_000),       // then EUR 0.10 per 10,000
				}},
			},
		},
	}
}

// addTeamPlan creates teamPlan through admit's admin API.
func addTeamPlan(ctx context.Context, a sandbox.Admin) error {
	return a.Do(ctx, http.MethodPost, "/v1/admin/plans", teamPlanBody(), http.StatusCreated, nil)
}

// accounts is the demo's tree. acme (on teamPlan) is the seeds' hierarchy, each level with a limit
// the traffic can run into: agent-1 holds 2 requests in flight at most (its third
// concurrent call is a 429 at the agent level), agent-2 has 2 requests/s with a burst of 4
// (its bursts of 8 are cut at the agent level), alice has a tokens rate her agent's
// token-heavy calls drain (a 429 at the user level once her burst is spent) and a monthly
// tokens quota (so reconcile settles estimated against actual tokens on her counter),
// marketing has a sliding window of 20 requests per 5 s (429 at the team level), and a
// spike from bob goes past the plan's 300-request burst (pro's rates) (429 at the org level). tinyco is a free
// org whose monthly quota is sized to run out early in the traffic (402), and bigcorp
// an enterprise org (no quota: counted, never refused). prepaidco is a free org that pays
// in advance: its calls carry cost_micros, drawn from the grants of credits.go.
//
// Guarantees: acme has 50,000 tokens/s (burst 400,000); engineering is guaranteed 15,000/s
// (burst 60,000) with a ceiling of 300,000 (75,000/s), marketing 5,000/s (burst 20,000).
// alice's and bob's tokens are about twice engineering's guarantee, so engineering borrows
// acme's spare (50,000 - 15,000 - 5,000 = 30,000/s) for the rest; marketing uses less than
// its guarantee and is never refused for tokens, however much engineering borrows.
//
// Waiting: bigcorp's support team has 5 requests/s (burst 5), shared by oncall (priority
// 90) and batch (priority 10), whose callers send max_wait_ms: together they ask for more,
// so requests wait in support's queue, oncall's first. (bigcorp's own 1,000/s is never
// reached, so nobody waits at the org level, behind which acme's traffic would queue.)
func accounts(d time.Duration) []account {
	q := func(n int64) map[string]any { return map[string]any{"quota": n} }
	return []account{
		{ID: "acme", Kind: "org", Plan: teamPlan,
			Limits: map[string]any{"tokens": map[string]any{"rate_per_s": 50_000, "burst": 400_000}}},
		{ID: "engineering", Kind: "team", Parent: "acme",
			Limits: map[string]any{"tokens": map[string]any{"rate_per_s": 15_000, "burst": 60_000, "ceiling": 300_000}}},
		{ID: "alice", Kind: "user", Parent: "engineering",
			Limits: map[string]any{"tokens": map[string]any{"rate_per_s": 25_000, "burst": 200_000, "quota": 100_000_000}}},
		{ID: "agent-1", Kind: "agent", Parent: "alice", Concurrency: 2, key: true},
		{ID: "agent-2", Kind: "agent", Parent: "alice",
			Limits: map[string]any{"requests": map[string]any{"rate_per_s": 2, "burst": 4}}, key: true},
		{ID: "bob", Kind: "user", Parent: "engineering", Limits: map[string]any{"requests": q(1_000_000)}, key: true},
		{ID: "marketing", Kind: "team", Parent: "acme",
			Limits: map[string]any{
				"requests": map[string]any{"algorithm": "sliding_window", "limit": 20, "window_s": 5},
				"tokens":   map[string]any{"rate_per_s": 5_000, "burst": 20_000, "ceiling": 40_000},
			}, key: true},
		{ID: "tinyco", Kind: "org", Plan: "free", Limits: map[string]any{"requests": q(freeQuota(d))}, key: true},
		{ID: "bigcorp", Kind: "org", Plan: "enterprise", key: true},
		{ID: "support", Kind: "team", Parent: "bigcorp",
			Limits: map[string]any{"requests": map[string]any{"rate_per_s": 5, "burst": 5}}},
		{ID: "oncall", Kind: "user", Parent: "support", Priority: 90, key: true},
		{ID: "batch", Kind: "user", Parent: "support", Priority: 10, key: true},
		{ID: prepaidOrg, Kind: "org", Plan: "free", note: "prepaid: its calls carry " + prepaidUnit + ", drawn from its grants", key: true},
	}
}

// freeQuota is tinyco's monthly requests quota: its opening burst (20 pass the free plan's
// rate limit) plus about a third of what it sends afterwards at 5/s, so it runs out about
// a third of the way through the traffic.
func freeQuota(d time.Duration) int64 { return 20 + int64(1.5*d.Seconds()) }

// setup creates the accounts and their API keys and returns the keys by account (waitLoaded
// then waits for admit's policy cache).
func setup(ctx context.Context, a sandbox.Admin, tree []account) (map[string]string, error) {
	keys := map[string]string{}
	for _, acc := range tree {
		if err := a.Do(ctx, http.MethodPost, "/v1/admin/accounts", acc, http.StatusCreated, nil); err != nil {
			return nil, err
		}
	}
	for _, acc := range tree {
		if !acc.key {
			continue
		}
		var reply struct {
			APIKey string `json:"api_key"`
		}
		if err := a.Do(ctx, http.MethodPost, "/v1/admin/api-keys", map[string]string{"account": acc.ID}, http.StatusCreated, &reply); err != nil {
			return nil, err
		}
		keys[acc.ID] = reply.APIKey
	}
	return keys, nil
}

// waitLoaded returns once admit's policy cache holds every write made so far: the accounts,
// and which of them have credit grants (drawn from only once the cache knows).
func waitLoaded(ctx context.Context, a sandbox.Admin, tree []account) error {
	first := tree[0]
	return a.WaitLoaded(ctx, first.ID, map[string]any{"plan": first.Plan, "limits": first.Limits})
}

// guarantees lists the tree's tokens guarantees (limits with a ceiling) with the accounts
// whose keys send requests under each, for the report.
func guarantees(tree []account) []Guarantee {
	parent := map[string]string{}
	for _, a := range tree {
		parent[a.ID] = a.Parent
	}
	var out []Guarantee
	for _, a := range tree {
		l, ok := a.Limits["tokens"].(map[string]any)
		if !ok || l["ceiling"] == nil {
			continue
		}
		g := Guarantee{Account: a.ID, Unit: "tokens", RatePerS: toInt(l["rate_per_s"]), Burst: toInt(l["burst"]), Ceiling: toInt(l["ceiling"])}
		for p := a.ID; p != ""; p = parent[p] {
			g.above = append(g.above, p)
		}
		for _, c := range tree {
			for p := c.ID; p != "" && c.key; p = parent[p] {
				if p == a.ID {
					g.callers = append(g.callers, c.ID)
					break
				}
			}
		}
		out = append(out, g)
	}
	return out
}

// printReserved shows what the effective policy (GET /v1/admin/accounts/{id}) of each
// parent of a guarantee reserves for its children's guarantees, and its spare.
func printReserved(ctx context.Context, out io.Writer, a sandbox.Admin, tree []account) error {
	for _, p := range tree {
		var reply struct {
			Effective struct {
				Path []struct {
					Account  string                        `json:"account"`
					Limits   map[string]policy.Limit       `json:"limits"`
					Reserved map[string]policy.Reservation `json:"reserved"`
				} `json:"path"`
			} `json:"effective"`
		}
		if guarantees(childrenOf(tree, p.ID)) == nil {
			continue
		}
		if err := a.Do(ctx, http.MethodGet, "/v1/admin/accounts/"+p.ID, nil, http.StatusOK, &reply); err != nil {
			return err
		}
		path := reply.Effective.Path
		if len(path) == 0 {
			return fmt.Errorf("account %s: no effective policy", p.ID)
		}
		lv := path[len(path)-1]
		units := make([]string, 0, len(lv.Reserved))
		for u := range lv.Reserved {
			units = append(units, u)
		}
		sort.Strings(units)
		for _, u := range units {
			r, l := lv.Reserved[u], lv.Limits[u]
			fmt.Fprintf(out, "  %s reserves %s %s/s burst %s for its children's guarantees (GET /v1/admin/accounts/%s: effective reserved); its spare: %s/s burst %s\n",
				lv.Account, u, num(int64(r.RatePerS)), num(r.Burst), lv.Account, num(int64(l.RatePerS-r.RatePerS)), num(l.Burst-r.Burst))
		}
	}
	return nil
}

// childrenOf returns the accounts whose parent is id.
func childrenOf(tree []account, id string) []account {
	var out []account
	for _, a := range tree {
		if a.Parent == id {
			out = append(out, a)
		}
	}
	return out
}
