package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/metergate/metergate/internal/topic"
)

// FreshDatabase drops and creates the database name on baseURL's server and returns its URL. When the role
// may not create databases (the local stack's role cannot), it uses a schema of that name
// in the configured database instead (every connection's search_path).
func FreshDatabase(ctx context.Context, baseURL, name string) (string, string, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "", "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return "", "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id := pgx.Identifier{name}.Sanitize()
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)")
	if err == nil {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+id)
	}
	if err == nil {
		u.Path = "/" + name
		return u.String(), fmt.Sprintf("database %s", name), nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
		return "", "", err
	}
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+id+" CASCADE"); err != nil {
		return "", "", err
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+id); err != nil {
		return "", "", err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	db := strings.TrimPrefix(u.Path, "/")
	return u.String(), fmt.Sprintf("schema %s of database %s", name, db), nil
}

// DropDatabase removes what FreshDatabase made.
func DropDatabase(ctx context.Context, baseURL, name string) error {
	conn, err := pgx.Connect(ctx, baseURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id := pgx.Identifier{name}.Sanitize()
	_, err1 := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+id+" CASCADE")
	_, err2 := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)")
	if err1 != nil && err2 != nil {
		return errors.Join(err1, err2)
	}
	return nil
}

// DeleteKeys deletes every key of admit's prefix (<prefix>{N}:...) and returns how many.
func DeleteKeys(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	n := 0
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+"{*", 1000).Result()
		if err != nil {
			return n, err
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				return n, err
			}
			n += len(keys)
		}
		if cursor = next; cursor == 0 {
			return n, nil
		}
	}
}

// DeleteTopics deletes every topic whose name starts with prefix: those of earlier runs
// that did not get to delete their own (interrupted, killed). It returns their names.
func DeleteTopics(ctx context.Context, brokers []string, prefix string) ([]string, error) {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	parts, err := conn.ReadPartitions()
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	seen := map[string]bool{}
	var names []string
	for _, p := range parts {
		if strings.HasPrefix(p.Topic, prefix) && !seen[p.Topic] {
			seen[p.Topic] = true
			names = append(names, p.Topic)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if err := topic.Delete(ctx, brokers, n); err != nil {
			return names, err
		}
	}
	return names, nil
}

// LastLine is the last line of s (a tool's JSON summary after its logs).
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
