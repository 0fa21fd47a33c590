package admission

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
)

// TestScriptLayout keeps the admission script's argument layout and reply codes in step
// with Go's: lua/admit.lua reads each block of arguments with one unpack marked
// "-- layout: <block>" and names its reply codes under "-- layout: reply"; argNames and
// replyCodes (admitter.go) must say the same. The behaviour tests catch a wrong order
// too, but this one names the field.
func TestScriptLayout(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../lua/admit.lua")
	require.NoError(t, err)
	blocks, codes := parseScriptLayout(t, string(src))
	want := map[string][]string{}
	for name, fields := range argNames {
		want[name] = fields
	}
	for name, fields := range progNames {
		want[name] = fields
	}
	require.Equal(t, want, blocks, "argument and program layout: lua/admit.lua (actual) against encode.go and limits.go (expected)")
	require.Equal(t, replyCodes, codes, "reply codes: lua/admit.lua (actual) against admitter.go (expected)")
	for name, want := range map[string]int64{"MAX_ATTEMPTS": MaxAttempts, "MAX_COUNTER": keyspace.MaxCounter} {
		m := regexp.MustCompile(`(?m)^local ` + name + ` = (\d+)$`).FindStringSubmatch(string(src))
		require.NotNil(t, m, "lua/admit.lua declares %s", name)
		require.Equal(t, strconv.FormatInt(want, 10), m[1], "%s: lua/admit.lua (actual) against Go (expected)", name)
	}
}

var (
	layoutMarker = regexp.MustCompile(`(?m)^\s*-- layout: (\w+)\n`)
	// local <names> = unpack(A, <first>, <last>) (A is ARGV; P a program), then the
	// cursor's move past the block: "a = a + n" (a decision's blocks; "p = p + n" in a
	// program) or "local a = n" (the call header; "local p = n" after a program's head).
	layoutUnpack = regexp.MustCompile(`^\s*local ([\w,\s]+?) = unpack\([AP], (a|p|1), (?:[ap] \+ )?(\d+)\)\n` +
		`\s*(?:[ap] = [ap] \+ (\d+)|local [ap] = (\d+))\b`)
	layoutCodes = regexp.MustCompile(`^local ([A-Z_]+(?:, [A-Z_]+)*) = (\d+(?:, \d+)*)$`)
)

// parseScriptLayout returns the fields of each argument block of an admission script, in
// order, and its reply codes.
func parseScriptLayout(t *testing.T, src string) (blocks map[string][]string, codes map[string]int64) {
	t.Helper()
	blocks, codes = map[string][]string{}, map[string]int64{}
	for _, m := range layoutMarker.FindAllStringSubmatchIndex(src, -1) {
		name, rest := src[m[2]:m[3]], src[m[1]:]
		if name == "reply" {
			for _, line := range strings.Split(rest, "\n") {
				c := layoutCodes.FindStringSubmatch(line)
				if c == nil {
					break
				}
				names, values := strings.Split(c[1], ", "), strings.Split(c[2], ", ")
				require.Len(t, values, len(names), "reply codes %q", line)
				for i, n := range names {
					v, err := strconv.ParseInt(values[i], 10, 64)
					require.NoError(t, err)
					codes[n] = v
				}
			}
			require.NotEmpty(t, codes, "no reply codes after -- layout: reply")
			continue
		}
		u := layoutUnpack.FindStringSubmatch(rest)
		require.NotNil(t, u, "-- layout: %s is not followed by local <names> = unpack(A, ...) and the cursor's move", name)
		var fields []string
		for _, f := range strings.Split(u[1], ",") {
			fields = append(fields, strings.TrimSpace(f))
		}
		last, _ := strconv.Atoi(u[3])
		next, _ := strconv.Atoi(u[4] + u[5])
		if u[2] == "1" { // the call header, ARGV[1..last]; the first decision starts after it
			require.Equal(t, len(fields), last, "layout %s: %d names for ARGV[1..%d]", name, len(fields), last)
			require.Equal(t, last+1, next, "layout %s: the cursor starts at %d, after ARGV[%d]", name, next, last)
		} else { // ARGV[a..a+last], then a moves past it
			require.Equal(t, len(fields), last+1, "layout %s: %d names for ARGV[a..a+%d]", name, len(fields), last)
			require.Equal(t, len(fields), next, "layout %s: the cursor moves %d for %d fields", name, next, len(fields))
		}
		_, dup := blocks[name]
		require.False(t, dup, "layout %s declared twice", name)
		blocks[name] = fields
	}
	return blocks, codes
}
