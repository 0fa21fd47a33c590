package main

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/policy"
)

// readiness is admit's /readyz: ready once the policies are loaded.
func readiness(rdb redis.UniversalClient, pool *pgxpool.Pool, cache *policy.Cache) *ops.Probes {
	probes := &ops.Probes{}
	// Without Redis, admit still serves rate-only accounts fail-open (and answers 503 for
	// the rest): a load balancer must keep sending it traffic.
	probes.AddDegraded("redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	// Decisions come from the policy cache: while PostgreSQL restarts admit keeps deciding
	// (policy changes wait), so PostgreSQL is a degraded check too.
	probes.AddDegraded("postgres", pool.Ping)
	probes.Add("policy", func(context.Context) error {
		if !cache.Loaded() {
			return errors.New("policies not loaded yet")
		}
		return nil
	})
	return probes
}
