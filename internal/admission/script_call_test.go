package admission_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// The usage event is written by the same script call as the counters it charges. Redis
// MONITOR, on every server the decision can reach, records what runs while one decision
// is taken: every command naming the test's keys that the admitter sent is an EVALSHA or
// EVAL, and the one script call that appended the event to the outbox (XADD) is the one
// that wrote every level's bucket and quota counter and took the leases. An XADD sent on
// its own, before or after the script, or by a second script call, fails the test; so
// does a script that writes the counters without the event.
func TestEventWrittenByTheChargingScriptCall(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		team := b.org + "-team"
		limits := map[policy.Unit]policy.Limit{
			policy.Requests: withQuota(bucket(100, 300), 1000, policy.Month),
			policy.Tokens:   withQuota(policy.Limit{}, 1_000_000, policy.Month),
		}
		pol := tree(
			policy.Level{Account: b.org, Kind: policy.Org, Concurrency: 10, Limits: limits},
			policy.Level{Account: team, Kind: policy.Team, Concurrency: 5, Limits: limits},
		)
		units := map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}

		mons := startMonitors(t, b.rdb, b.keys.Prefix)
		d, err := b.decide(t, pol, units, "once")
		require.NoError(t, err)
		require.Equal(t, admission.Allow, d.Result)
		calls, strays := stopMonitors(t, b.rdb, mons)

		outbox := b.keys.Outbox(b.keys.Shard(b.org))
		var writers []scriptCall
		for _, c := range calls {
			name := strings.ToLower(c.cmd[0])
			require.Contains(t, []string{"evalsha", "eval"}, name,
				"the admitter sent %q naming the test's keys outside a script", c.cmd)
			for _, l := range c.lua {
				if strings.EqualFold(l[0], "XADD") && l[1] == outbox {
					writers = append(writers, c)
					break
				}
			}
		}
		require.Empty(t, strays, "commands run on the test's keys by a script that did not name them")
		require.Len(t, writers, 1, "one script call appended the event to the outbox; calls: %v", calls)
		w := writers[0]
		for _, lv := range pol.Path {
			for _, u := range []policy.Unit{policy.Requests, policy.Tokens} {
				require.True(t, w.wrote("SET", b.keys.Quota(b.org, lv.Account, u, d.Period)),
					"the call that wrote the event charged %s's %s quota: %v", lv.Account, u, w.lua)
			}
			require.True(t, w.wroteField("HSET", b.stateHash(), b.bucketFields(lv.Account)[0]),
				"and %s's requests bucket: %v", lv.Account, w.lua)
		}
		require.True(t, w.wrote("ZADD", ""), "and took the leases: %v", w.lua)

		// What that call left: the event the caller was told of, and the counters.
		events := b.outbox(t, b.org)
		require.Len(t, events, 1)
		require.Equal(t, d.EventID, events[0].ID)
		ctx := testenv.Context(t, 10*time.Second)
		for _, lv := range pol.Path {
			used, err := b.rdb.Get(ctx, b.keys.Quota(b.org, lv.Account, policy.Tokens, d.Period)).Int64()
			require.NoError(t, err)
			require.Equal(t, int64(2500), used, "%s's tokens", lv.Account)
		}
	})
}

// scriptCall is a command a client sent that names the test's keys, with the commands a
// script it ran ran, in order (MONITOR shows them as from "lua", right after it).
type scriptCall struct {
	cmd []string
	lua [][]string
}

// wrote reports whether the call's script ran cmd on key ("": on any key).
func (c scriptCall) wrote(cmd, key string) bool {
	for _, l := range c.lua {
		if strings.EqualFold(l[0], cmd) && len(l) > 1 && (key == "" || l[1] == key) {
			return true
		}
	}
	return false
}

// wroteField reports whether the call's script ran cmd on the hash key naming field.
func (c scriptCall) wroteField(cmd, key, field string) bool {
	for _, l := range c.lua {
		if strings.EqualFold(l[0], cmd) && len(l) > 2 && l[1] == key && slices.Contains(l[2:], field) {
			return true
		}
	}
	return false
}

// monitor is MONITOR on one Redis server, on a connection of its own.
type monitor struct {
	conn     net.Conn
	sentinel string
	mu       sync.Mutex
	calls    []scriptCall // commands naming the prefix, with their scripts' commands
	strays   [][]string   // script commands naming the prefix, of a call that does not
	seen     bool         // the sentinel came by: every command before it is in
	err      error
}

// startMonitors starts MONITOR on the server, or on every master of a Redis Cluster, and
// records the commands that name prefix.
func startMonitors(t *testing.T, rdb redis.UniversalClient, prefix string) []*monitor {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	var addrs []string
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		require.NoError(t, cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			addrs = append(addrs, c.Options().Addr)
			return nil
		}))
	} else {
		opts, err := redis.ParseURL(testenv.RedisURL(t))
		require.NoError(t, err)
		require.Empty(t, opts.Password, "MONITOR here speaks no AUTH")
		addrs = []string{opts.Addr}
	}
	var mons []*monitor
	for _, addr := range addrs {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		rd := bufio.NewReader(conn)
		_, err = conn.Write([]byte("*1\r\n$7\r\nMONITOR\r\n"))
		require.NoError(t, err)
		ok, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "+OK\r\n", ok, "MONITOR on %s", addr)
		m := &monitor{conn: conn, sentinel: "sentinel-" + testenv.Random(8)}
		go m.read(rd, prefix)
		mons = append(mons, m)
	}
	return mons
}

// read records the monitored lines until the connection is closed.
func (m *monitor) read(rd *bufio.Reader, prefix string) {
	ours := false // the last client command named the prefix
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			m.mu.Lock()
			m.err = err
			m.mu.Unlock()
			return
		}
		// "+<time> [<db> <client address>] "<cmd>" "<arg>"..." or "[<db> lua] ..."
		line = strings.TrimRight(strings.TrimPrefix(line, "+"), "\r\n")
		open, end := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
		if open < 0 || end < open {
			continue
		}
		fromScript := strings.HasSuffix(line[open:end], " lua")
		named := strings.Contains(line, prefix)
		if !fromScript {
			ours = named
		}
		if !named && !ours && !strings.Contains(line, m.sentinel) {
			continue
		}
		args, perr := monitorArgs(line[end+1:])
		m.mu.Lock()
		switch {
		case perr != nil:
			m.err = fmt.Errorf("monitor line %q: %w", line, perr)
			ours = false
		case !fromScript && strings.EqualFold(args[0], "echo") && len(args) == 2 && args[1] == m.sentinel:
			m.seen = true
		case !fromScript:
			m.calls = append(m.calls, scriptCall{cmd: args})
		case ours && len(m.calls) > 0:
			c := &m.calls[len(m.calls)-1]
			c.lua = append(c.lua, args)
		default:
			m.strays = append(m.strays, args)
		}
		m.mu.Unlock()
	}
}

// monitorArgs reads the quoted arguments of a MONITOR line: "a" "b\"c" "\x00".
func monitorArgs(s string) ([]string, error) {
	var args []string
	for i := 0; i < len(s); {
		if s[i] == ' ' {
			i++
			continue
		}
		if s[i] != '"' {
			return nil, fmt.Errorf("argument at %d is not quoted", i)
		}
		j := i + 1
		for ; j < len(s) && s[j] != '"'; j++ {
			if s[j] == '\\' {
				j++
			}
		}
		if j >= len(s) {
			return nil, fmt.Errorf("argument at %d is not closed", i)
		}
		arg, err := strconv.Unquote(s[i : j+1])
		if err != nil {
			return nil, fmt.Errorf("argument at %d: %w", i, err)
		}
		args = append(args, arg)
		i = j + 1
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("no command")
	}
	return args, nil
}

// stopMonitors waits until each monitor has seen everything run so far (an ECHO of its
// sentinel sent after it), stops them and returns their calls and strays.
func stopMonitors(t *testing.T, rdb redis.UniversalClient, mons []*monitor) (calls []scriptCall, strays [][]string) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	for _, m := range mons {
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
				return c.Echo(ctx, m.sentinel).Err()
			}))
		} else {
			require.NoError(t, rdb.Echo(ctx, m.sentinel).Err())
		}
	}
	for _, m := range mons {
		for {
			m.mu.Lock()
			seen, err := m.seen, m.err
			m.mu.Unlock()
			require.NoError(t, err)
			if seen {
				break
			}
			require.NoError(t, ctx.Err(), "MONITOR never showed the sentinel")
			time.Sleep(5 * time.Millisecond)
		}
		_ = m.conn.Close()
		m.mu.Lock()
		calls = append(calls, m.calls...)
		strays = append(strays, m.strays...)
		m.mu.Unlock()
	}
	return calls, strays
}
