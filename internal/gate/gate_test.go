package gate_test

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// policies is a fixed set of accounts, each its own org; no API keys.
type policies map[string]policy.Resolved

func (p policies) Resolve(account string) (policy.Resolved, error) {
	pol, ok := p[account]
	if !ok {
		return policy.Resolved{}, errors.New("no such account")
	}
	return pol, nil
}

func (p policies) Authenticate(string) (policy.APIKey, policy.Resolved, error) {
	return policy.APIKey{}, policy.Resolved{}, errors.New("no API keys")
}

// hook keeps the refusals the gate tells it of.
type hook struct {
	mu  sync.Mutex
	got []gate.Refusal
}

func (h *hook) Refused(r gate.Refusal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, r)
}

func (h *hook) refusals() []gate.Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]gate.Refusal(nil), h.got...)
}

// org is an org of one level whose limits allow one request, then refuse with status:
// a token bucket of burst 1 (429) or a monthly quota of 1 (402).
func org(id string, status int, shadow bool) policy.Resolved {
	limit := policy.Limit{RatePerS: 0.001, Burst: 1}
	if status == http.StatusPaymentRequired {
		one := int64(1)
		limit = policy.Limit{Limit: 1000, WindowS: 3600, Quota: &one, QuotaPeriod: policy.Month}
	}
	lv := policy.Level{Account: id, Kind: policy.Org, Limits: map[policy.Unit]policy.Limit{policy.Requests: limit.Normalize()}}
	return policy.Resolved{Org: id, Plan: "pro", Path: []policy.Level{lv}, Shadow: shadow}
}

// Every refusal by a limit reaches the Refusals hook with what the console's "Why?" shows;
// admissions, shadow-mode admissions and requests refused before a decision do not.
func TestRefusalsReachTheHook(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	adm := admission.New(testenv.Redis(t), admission.Options{KeyPrefix: testenv.Prefix(t) + "mg"})
	t.Cleanup(adm.Close)
	name := strings.ReplaceAll(testenv.Name(t), "_", "-")
	rated, quota, shadow := name+"-rate", name+"-quota", name+"-shadow"
	pols := policies{
		rated:  org(rated, http.StatusTooManyRequests, false),
		quota:  org(quota, http.StatusPaymentRequired, false),
		shadow: org(shadow, http.StatusTooManyRequests, true),
	}
	h := &hook{}
	g := gate.New(gate.Config{Policies: pols, Decider: adm, Source: "test", Refusals: h})
	t.Cleanup(func() { require.NoError(t, g.Close(ctx)) })
	one := map[policy.Unit]int64{policy.Requests: 1}
	admit := func(account, idem, via string) admission.Result {
		t.Helper()
		a, err := g.Admit(ctx, gate.Input{Account: account, IdempotencyKey: idem, Units: one, Via: via})
		require.NoError(t, err)
		return a.Decision.Result
	}

	require.Equal(t, admission.Allow, admit(rated, "r1", "admit"))
	require.Equal(t, admission.Allow, admit(quota, "q1", ""))
	require.Equal(t, admission.Allow, admit(shadow, "s1", "admit"))
	require.Equal(t, admission.Allow, admit(shadow, "s2", "admit"), "shadow mode admits what a limit refuses")
	_, err := g.Admit(ctx, gate.Input{Account: name + "-nobody", IdempotencyKey: "n1", Units: one})
	var ge *gate.Error
	require.ErrorAs(t, err, &ge, "refused before a decision")
	require.Empty(t, h.refusals(), "admissions, shadow admissions and bad input are not refusals by a limit")

	before := time.Now()
	require.Equal(t, admission.RateLimited, admit(rated, "r2", "check"))
	require.Equal(t, admission.QuotaExceeded, admit(quota, "q2", ""))
	got := h.refusals()
	require.Len(t, got, 2)

	r := got[0]
	require.WithinDuration(t, before, r.Time, 5*time.Second, "the decision's time")
	r.Time = time.Time{}
	require.Positive(t, r.RetryAfter)
	r.RetryAfter = 0
	require.Equal(t, gate.Refusal{Org: rated, Account: rated, IdempotencyKey: "r2", Status: http.StatusTooManyRequests,
		Result: admission.RateLimited, Blocked: admission.Blocker{Account: rated, Level: policy.Org, Unit: "requests"},
		Via: "check", Units: one}, r)

	q := got[1]
	require.Equal(t, http.StatusPaymentRequired, q.Status)
	require.Equal(t, admission.QuotaExceeded, q.Result)
	require.Equal(t, "q2", q.IdempotencyKey)
	require.Equal(t, admission.Blocker{Account: quota, Level: policy.Org, Unit: "requests"}, q.Blocked)
	require.Equal(t, q.Time.UTC().Format("2006-01"), q.Period, "the spent quota's period")
	require.Equal(t, "service", q.Via, "without Via, the door's name")
}
