package admission_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// replicated starts a private primary and a replica of it and returns clients of each.
func replicated(t *testing.T) (primary, replica *redis.Client, replicaOpts *redis.Options) {
	t.Helper()
	p, r := private.StartRedisReplicated(t)
	primary = redis.NewClient(&redis.Options{Addr: p.Addr()})
	replicaOpts = &redis.Options{Addr: r.Addr()}
	replica = redis.NewClient(replicaOpts)
	t.Cleanup(func() { _ = primary.Close(); _ = replica.Close() })
	return primary, replica, replicaOpts
}

// replicatedAdmitter is an Admitter on primary that waits for one replica, at most wait.
func replicatedAdmitter(t *testing.T, primary *redis.Client, wait time.Duration) (*admission.Admitter, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return admission.New(primary, admission.Options{KeyPrefix: testenv.Prefix(t) + "mg", Registerer: reg,
		WaitReplicas: 1, WaitTimeout: wait}), reg
}

// With ADMIT_REDIS_WAIT_REPLICAS a decision is answered only once the replica holds what
// the script wrote: a replica busy for 400 ms holds the answer back as long, and the
// event is on the replica when the answer comes.
func TestWaitReplicasHoldsTheAnswer(t *testing.T) {
	t.Parallel()
	primary, replica, replicaOpts := replicated(t)
	adm, _ := replicatedAdmitter(t, primary, 5*time.Second)
	org := "wait-org"
	pol := tree(policy.Level{Account: org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: perHour(1000)}})
	ctx := testenv.Context(t, time.Minute)
	req := func() admission.Request {
		return admission.Request{EventID: adm.NewEventID(org), Units: map[policy.Unit]int64{policy.Requests: 1}, Policy: pol, Source: "test"}
	}

	d, err := adm.Decide(ctx, req())
	require.NoError(t, err)
	require.Equal(t, admission.Allow, d.Result, "a healthy replica acknowledges at once")

	stall := 400 * time.Millisecond
	done, err := private.StallRedis(ctx, replicaOpts, stall)
	require.NoError(t, err)
	start := time.Now()
	r := req()
	d, err = adm.Decide(ctx, r)
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, admission.Allow, d.Result)
	require.NoError(t, <-done)
	// The stall had begun before Decide was called; the answer waited for most of it.
	require.GreaterOrEqual(t, took, stall/2, "the answer left before the busy replica acknowledged the event")
	n, err := replica.XLen(ctx, adm.Keys().Outbox(adm.Keys().Shard(org))).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "both events are on the replica")
}

// A replica that does not acknowledge within the timeout fails the call with
// ErrNotReplicated, which the caller answers as an unknown outcome (503, voided); the
// metric counts it. Voids wait for the replica too.
func TestWaitReplicasShortFails(t *testing.T) {
	t.Parallel()
	primary, _, replicaOpts := replicated(t)
	adm, reg := replicatedAdmitter(t, primary, 50*time.Millisecond)
	org := "wait-short"
	pol := tree(policy.Level{Account: org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: perHour(1000)}})
	ctx := testenv.Context(t, time.Minute)

	done, err := private.StallRedis(ctx, replicaOpts, 1500*time.Millisecond)
	require.NoError(t, err)
	r := admission.Request{EventID: adm.NewEventID(org), Units: map[policy.Unit]int64{policy.Requests: 1}, Policy: pol, Source: "test"}
	_, err = adm.Decide(ctx, r)
	require.ErrorIs(t, err, keyspace.ErrNotReplicated)
	require.False(t, errors.Is(err, admission.ErrNotSent), "the script ran: the outcome is unknown, not 'nothing happened'")
	_, err = adm.Void(ctx, admission.Void{Request: r, Reason: "unavailable"})
	require.ErrorIs(t, err, keyspace.ErrNotReplicated, "a void is not taken as done before a replica holds it")
	require.NoError(t, <-done)
	require.Equal(t, 2.0, testenv.CounterValue(t, reg, "metergate_admit_not_replicated_total"))

	// The replica is back (once it has worked through its backlog): the void goes through.
	require.Eventually(t, func() bool {
		_, err := adm.Void(ctx, admission.Void{Request: r, Reason: "unavailable"})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "void once the replica acknowledges")
}

// On a Cluster the WAIT goes to the master of the org's shard in the same pipeline as the
// script: the shared Cluster has no replicas, so every call is short of one, and none
// fails for another reason (a WAIT sent to another node, a cross-slot error).
func TestWaitReplicasOnCluster(t *testing.T) {
	t.Parallel()
	rdb := testenv.RedisCluster(t)
	adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(t) + "mg", WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	ctx := testenv.Context(t, time.Minute)
	for _, org := range []string{"wait-a", "wait-b", "wait-c", "wait-d", "wait-e", "wait-f"} {
		pol := tree(policy.Level{Account: org, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: perHour(1000)}})
		_, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(org), Units: map[policy.Unit]int64{policy.Requests: 1}, Policy: pol, Source: "test"})
		require.ErrorIs(t, err, keyspace.ErrNotReplicated, "org %s", org)
		require.Contains(t, err.Error(), "0 of 1")
	}
}
