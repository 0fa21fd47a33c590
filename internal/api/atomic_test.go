package api_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// All-or-nothing through the HTTP API: a request refused at any level of org → team →
// user → agent, by a token bucket (429), a concurrency cap (429) or a quota (402), leaves
// every Redis key of the test as it was — buckets, sliding windows, quota counters, leases,
// idempotency records and the outbox stream — and the refusal names the level and the
// limit that refused it. An allowed request just before it must change every one of those
// keys at every level, so a snapshot that cannot see a kind of state fails the test
// rather than passing it.
func TestRefusalChangesNothingAtAnyLevel(t *testing.T) {
	t.Parallel()
	levels := []policy.Kind{policy.Org, policy.Team, policy.User, policy.Agent}
	type refusal struct {
		name     string
		status   int
		decision string
		unit     string // of blocked_by
	}
	refusals := []refusal{
		{"rate", http.StatusTooManyRequests, "rate_limited", "tokens"},
		{"concurrency", http.StatusTooManyRequests, "rate_limited", "concurrent-requests"},
		{"quota", http.StatusPaymentRequired, "quota_exceeded", "tokens"},
	}
	onRedisAndCluster(t, func(t *testing.T, o setupOpts) {
		for _, lv := range levels {
			for _, rf := range refusals {
				t.Run(string(lv)+"_"+rf.name, func(t *testing.T) {
					t.Parallel()
					// setup with this subtest's t: the admitter's keys start with
					// testenv.Prefix of it, which no other test shares.
					b := setup(t, o)
					match := keyPattern(t)
					ids := map[policy.Kind]string{}
					parent := ""
					for _, kind := range levels {
						id := b.id(string(kind))
						body := map[string]any{"id": id, "kind": string(kind), "limits": roomyLimits(), "concurrency": 100}
						if kind == policy.Org {
							body["plan"] = "enterprise"
						} else {
							body["parent"] = parent
						}
						// The refusing limit: 3,000 tokens in the bucket (refilling 1 per 100 s),
						// a concurrency cap of 1, or a monthly quota of 3,000 tokens. The request
						// before takes 2,000 tokens (and the one slot); the refused one asks for
						// 2,000 more.
						if kind == lv {
							switch rf.name {
							case "rate":
								body["limits"].(map[string]any)["tokens"] = map[string]any{"rate_per_s": 0.01, "burst": 3000, "quota": 1_000_000_000}
							case "concurrency":
								body["concurrency"] = 1
							case "quota":
								body["limits"].(map[string]any)["tokens"] = map[string]any{"rate_per_s": 1000, "burst": 1_000_000, "quota": 3000}
							}
						}
						b.account(t, body)
						ids[kind] = id
						parent = id
					}
					agent := ids[policy.Agent]
					b.waitResolvable(t, agent)
					units := map[string]any{"requests": 1, "tokens": 2000}

					before := snapshot(t, o.rdb, match)
					r := b.admit(t, map[string]any{"account": agent, "idempotency_key": "allowed", "units": units})
					require.Equal(t, http.StatusOK, r.Status, r.Raw)
					allowed := snapshot(t, o.rdb, match)
					// Earlier runs of this test (or one running in another process) left keys
					// under prefixes of the same pattern: ours is the one whose keys name this
					// run's accounts.
					prefix := ownPrefix(t, allowed, ids[policy.Org])
					t.Cleanup(func() { deleteKeys(o.rdb, allowed) })
					before, allowed = only(before, prefix), only(allowed, prefix)
					// The allowed request changed, at every level, the token bucket (a field
					// of the org's state hash), the requests window (a sorted set), both quota
					// counters (strings) and the leases (a sorted set); and the idempotency
					// record (a field of the shard's idempotency bucket, named by a hash), the
					// account's program in the org's policy mirror (a field named by its
					// version: the node's first decision of the policy sends it), the lease
					// record and the outbox stream.
					wantChanged := map[string]map[string]int{"": {"string": 1, "stream": 1, "hash": 2}}
					for _, kind := range levels {
						wantChanged[ids[kind]] = map[string]int{"hash": 1, "string": 2, "zset": 2}
					}
					require.Equal(t, wantChanged, changedKeys(before, allowed, ids),
						"what the allowed request changed, by account and type\nbefore: %v\nafter: %v", before, allowed)

					r = b.admit(t, map[string]any{"account": agent, "idempotency_key": "refused", "units": units})
					after := only(snapshot(t, o.rdb, match), prefix)
					require.Equal(t, rf.status, r.Status, r.Raw)
					require.Equal(t, rf.decision, r.Body["decision"], r.Raw)
					require.Equal(t, map[string]any{"account": ids[lv], "level": string(lv), "unit": rf.unit}, r.Body["blocked_by"], r.Raw)
					require.Equal(t, allowed, after, "the refused request changed Redis")
				})
			}
		}
	})
}

// roomyLimits are limits at a level that no request of the test comes near, each kept in
// Redis in its own way: a sliding window of requests (sorted set), a daily requests quota
// and a token bucket with a monthly quota (strings).
func roomyLimits() map[string]any {
	return map[string]any{
		"requests": map[string]any{"algorithm": "sliding_window", "limit": 1000, "window_s": 3600, "quota": 1000, "quota_period": "day"},
		"tokens":   map[string]any{"rate_per_s": 1000, "burst": 1_000_000, "quota": 1_000_000_000},
	}
}

// keyPattern is a SCAN pattern of every Redis key that a test's admitter can have made:
// setup gives it the prefix testenv.Prefix(t), "t:<name>_<8 hex>:", and the name is
// testenv.Name(t) less its random part.
func keyPattern(t *testing.T) string {
	name := testenv.Name(t)
	return "t:" + name[:len(name)-len("_")-8] + "_????????:*"
}

// testPrefix returns the test prefix ("t:<name>:", see testenv.Prefix) a key starts with.
func testPrefix(k string) string {
	if i := strings.Index(k[2:], ":"); strings.HasPrefix(k, "t:") && i >= 0 {
		return k[:i+3]
	}
	return ""
}

// ownPrefix returns the one test prefix of the snapshot under which a key names the
// account id (ids are unique to a run).
func ownPrefix(t *testing.T, snap map[string]string, id string) string {
	t.Helper()
	seen := map[string]bool{}
	for k := range snap {
		if strings.Contains(k, ":"+id+":") {
			seen[testPrefix(k)] = true
		}
	}
	require.Len(t, seen, 1, "one test prefix with keys of %s", id)
	for p := range seen {
		return p
	}
	return ""
}

// only returns the keys of snap under prefix.
func only(snap map[string]string, prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range snap {
		if testPrefix(k) == prefix {
			out[k] = v
		}
	}
	return out
}

// deleteKeys deletes the snapshot's keys (one at a time: on a Redis Cluster a DEL of
// several keys must stay in one slot).
func deleteKeys(rdb redis.UniversalClient, snap map[string]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for k := range snap {
		k, _, _ = strings.Cut(k, "\x00") // a hash's field
		_ = rdb.Del(ctx, k).Err()
	}
}

// snapshot returns every key matching match with its value, by type (TTLs left out: they
// move with time): a string's value; a hash's fields, each as its own entry
// "<key>\x00<field>" (a hash holds the state of several accounts); a sorted set's members
// with their scores; a stream's length and last id; a list's or a set's members. On a
// Redis Cluster every master is scanned.
func snapshot(t *testing.T, rdb redis.UniversalClient, match string) map[string]string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	var mu sync.Mutex
	out := map[string]string{}
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			v, err := dump(ctx, c, k)
			if err != nil {
				return fmt.Errorf("dump %s: %w", k, err)
			}
			if v == "" {
				continue // gone between SCAN and TYPE
			}
			mu.Lock()
			if strings.HasPrefix(v, "hash:") {
				fields, err := c.HGetAll(ctx, k).Result()
				if err != nil {
					mu.Unlock()
					return fmt.Errorf("dump %s: %w", k, err)
				}
				for f, x := range fields {
					out[k+"\x00"+f] = "hash:" + x
				}
			} else {
				out[k] = v
			}
			mu.Unlock()
		}
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) }))
	} else {
		require.NoError(t, scan(ctx, rdb))
	}
	return out
}

// dump is a key's type and value as snapshot keeps it; "" when the key does not exist.
func dump(ctx context.Context, c redis.Cmdable, k string) (string, error) {
	typ, err := c.Type(ctx, k).Result()
	if err != nil {
		return "", err
	}
	var v string
	switch typ {
	case "none":
		return "", nil
	case "string":
		v, err = c.Get(ctx, k).Result()
	case "hash":
		var m map[string]string
		m, err = c.HGetAll(ctx, k).Result()
		fields := make([]string, 0, len(m))
		for f, x := range m {
			fields = append(fields, f+"="+x)
		}
		sort.Strings(fields)
		v = strings.Join(fields, " ")
	case "zset":
		var zs []redis.Z
		zs, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		members := make([]string, 0, len(zs))
		for _, z := range zs {
			members = append(members, fmt.Sprintf("%v@%s", z.Member, strconv.FormatFloat(z.Score, 'g', -1, 64)))
		}
		v = strings.Join(members, " ")
	case "stream":
		var info *redis.XInfoStream
		info, err = c.XInfoStream(ctx, k).Result()
		if err == nil {
			v = fmt.Sprintf("length=%d last=%s", info.Length, info.LastGeneratedID)
		}
	case "list":
		var items []string
		items, err = c.LRange(ctx, k, 0, -1).Result()
		v = strings.Join(items, " ")
	case "set":
		var items []string
		items, err = c.SMembers(ctx, k).Result()
		sort.Strings(items)
		v = strings.Join(items, " ")
	default:
		v = "(not dumped)"
	}
	if err != nil {
		return "", err
	}
	return typ + ":" + v, nil
}

// changedKeys counts the keys (and hash fields) that differ between two snapshots (new,
// gone or another value) by the account they are of ("" for keys of no account) and by
// type. A key is of an account when its name holds the account id between colons or ends
// with ":<id>"; a hash field when it starts with "<id>:" (a token bucket's).
func changedKeys(a, b map[string]string, accounts map[policy.Kind]string) map[string]map[string]int {
	out := map[string]map[string]int{}
	count := func(k, v string) {
		owner := ""
		_, field, isField := strings.Cut(k, "\x00")
		for _, id := range accounts {
			if isField && strings.HasPrefix(field, id+":") ||
				!isField && (strings.Contains(k, ":"+id+":") || strings.HasSuffix(k, ":"+id)) {
				owner = id
			}
		}
		typ, _, _ := strings.Cut(v, ":")
		if out[owner] == nil {
			out[owner] = map[string]int{}
		}
		out[owner][typ]++
	}
	for k, v := range b {
		if a[k] != v {
			count(k, v)
		}
	}
	for k, v := range a {
		if _, ok := b[k]; !ok {
			count(k, v)
		}
	}
	return out
}
