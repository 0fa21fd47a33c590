package private_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

func TestPrivateRedis(t *testing.T) {
	t.Parallel()
	r := private.StartRedis(t)
	opts, err := redis.ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.MaxRetries = -1
	c := redis.NewClient(opts)
	defer c.Close()
	ctx := testenv.Context(t, 2*time.Minute)

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("set on the private redis: %v", err)
	}
	r.Stop()
	if err := c.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET answered while the private redis was stopped")
	}
	r.Start()
	got, err := c.Get(ctx, "k").Result()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("after a restart: GET k = %q, %v; want an empty server (redis.Nil)", got, err)
	}
	if err := c.Set(ctx, "k", "w", 0).Err(); err != nil {
		t.Fatalf("set after the restart: %v", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 1 {
		t.Fatalf("DBSIZE after the restart = %d, %v; want 1", n, err)
	}
}

func TestPrivatePostgres(t *testing.T) {
	t.Parallel()
	p := private.StartPostgres(t)
	ctx := testenv.Context(t, 3*time.Minute)
	query := func() (int, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, p.URL())
		if err != nil {
			return 0, err
		}
		defer conn.Close(cctx)
		var n int
		err = conn.QueryRow(cctx, `select sum(x) from t`).Scan(&n)
		return n, err
	}

	conn, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		t.Fatalf("connect to %s: %v", p.URL(), err)
	}
	if _, err := conn.Exec(ctx, `create table t (x int); insert into t values (1), (2), (3)`); err != nil {
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(ctx, `select current_database()`).Scan(&db); err != nil || db != "metergate" {
		t.Fatalf("current_database() = %q, %v", db, err)
	}

	p.Stop()
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("an open connection still answers after Stop")
	}
	_ = conn.Close(ctx)
	if _, err := query(); err == nil {
		t.Fatal("a new connection succeeded while the server was stopped")
	}

	p.Start()
	if n, err := query(); err != nil || n != 6 {
		t.Fatalf("after Start: sum = %d, %v; want 6 (the data kept)", n, err)
	}

	p.Kill() // immediate: the committed rows survive the crash recovery
	if _, err := query(); err == nil {
		t.Fatal("a new connection succeeded after Kill")
	}
	p.Start()
	if n, err := query(); err != nil || n != 6 {
		t.Fatalf("after Kill and Start: sum = %d, %v; want 6", n, err)
	}

	p.Restart()
	if n, err := query(); err != nil || n != 6 {
		t.Fatalf("after Restart: sum = %d, %v; want 6", n, err)
	}
}

// TestPrivateRedisAOF: a private Redis with an AOF fsynced on every write, killed with
// SIGKILL and started again, holds what it acknowledged.
func TestPrivateRedisAOF(t *testing.T) {
	t.Parallel()
	r := private.StartRedisAOF(t, "always")
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx := testenv.Context(t, 2*time.Minute)

	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []string{"e", "1"}}).Err(); err != nil {
		t.Fatalf("xadd on the private redis: %v", err)
	}
	r.Stop()
	r.Start()
	if n, err := c.XLen(ctx, "s").Result(); err != nil || n != 1 {
		t.Fatalf("after SIGKILL and a restart from the AOF: XLEN s = %d, %v; want 1", n, err)
	}
}
