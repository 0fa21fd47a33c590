package keyspace_test

import (
	"path"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
)

// Reconcile finds quota counters by QuotaPattern and reads them with ParseQuota: both must
// agree with Quota, and ParseQuota must refuse every other key.
func TestQuotaKeysRoundTrip(t *testing.T) {
	t.Parallel()
	k := keyspace.Keys{Prefix: "t:x:mg", Shards: 16}
	for _, label := range []string{"2026-11", "2026-11-23"} {
		key := k.Quota("acme", "agent-1.b", policy.Tokens, label)
		ok, err := path.Match(k.QuotaPattern(label), key) // SCAN MATCH's glob, for these keys
		require.NoError(t, err)
		require.True(t, ok, "%s matches %s", key, k.QuotaPattern(label))
		account, unit, got, ok := k.ParseQuota(key)
		require.True(t, ok)
		require.Equal(t, []string{"agent-1.b", "tokens", label}, []string{account, string(unit), got})
	}
	for _, other := range []string{
		k.Outbox(3), k.Marker("acme", 7), k.Refusals("acme"), "t:x:mg{3}:b:acme:tokens", "other{3}:q:acme:tokens:2026-11",
		"t:x:mg{3}:q:acme:bytes:2026-11", "t:x:mg{3}:q:acme:tokens", "t:x:mg{3}:q:ac me:tokens:2026-11",
	} {
		_, _, _, ok := k.ParseQuota(other)
		require.False(t, ok, other)
	}
	require.Equal(t, k.Tag(k.Shard("acme"))+"adj:7", k.Marker("acme", 7),
		"a correction's marker is in the hash tag of the org's counters")
}

// An org's refusal log is in the hash tag of the org's other keys: on a Redis Cluster it
// lives beside them, and a shard's keys stay in one slot.
func TestRefusalsKeyIsInTheOrgsSlot(t *testing.T) {
	t.Parallel()
	k := keyspace.Keys{Prefix: "t:x:mg", Shards: 16}
	require.Equal(t, k.Tag(k.Shard("acme"))+"r:acme", k.Refusals("acme"))
	require.NotEqual(t, k.Refusals("acme"), k.Refusals("bigco"))
}
