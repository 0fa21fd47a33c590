package policy_test

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/metergate/metergate/internal/policy"
)

// ValidID is a loop; the pattern of the accounts table's CHECK is its oracle.
func TestValidID(t *testing.T) {
	oracle := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	cases := []string{"", "a", "acme", "agent-1", "a.b_c-d", "-a", ".a", "_a", "a b", "a\x00", "é", "a/b",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "A9", "9", "a\n"}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "aZ09._- /\x00\xffé:{}"
	for range 20000 {
		var b strings.Builder
		for range rng.IntN(70) {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		cases = append(cases, b.String())
	}
	for _, c := range cases {
		if got, want := policy.ValidID(c), oracle.MatchString(c); got != want {
			t.Fatalf("ValidID(%q) = %v, want %v", c, got, want)
		}
	}
}
