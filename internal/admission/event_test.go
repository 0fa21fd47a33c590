package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// What an Admitter derives from a policy stays its own: another Admitter (another key
// prefix) deciding with the same policy gets its own keys.
func TestLimitsArePerAdmitter(t *testing.T) {
	limit := policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 10, Burst: 20}
	pol := policy.Resolved{Org: "acme", Stamp: policy.NewStamp(), Path: []policy.Level{
		{Account: "acme", Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: limit}}}}
	r := Request{EventID: "e1", Policy: pol, Units: map[policy.Unit]int64{policy.Requests: 1}}
	for _, prefix := range []string{"one", "two", "one"} {
		keys, _, err := New(nil, Options{KeyPrefix: prefix}).ScriptCall(r)
		require.NoError(t, err)
		require.Len(t, keys, 2)
		require.Regexp(t, `^`+prefix+`\{\d+\}:s:acme$`, keys[1], "the org's state hash")
	}
}
