package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// Shadow mode resolves down the tree: an org on a plan in shadow mode, and everything
// below it; an account in shadow mode, and everything below it; nothing else.
func TestShadowResolves(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	p := teamPlan()
	p.Shadow = true
	_, err := b.store.CreatePlan(b.ctx, p, nil)
	require.NoError(t, err)
	got, err := b.store.GetPlan(b.ctx, p.ID)
	require.NoError(t, err)
	require.True(t, got.Shadow)
	b.create(t, policy.Account{ID: b.id("trial"), Kind: policy.Org, Plan: p.ID})
	b.create(t, policy.Account{ID: b.id("trial-user"), Kind: policy.User, Parent: b.id("trial")})
	b.create(t, policy.Account{ID: b.id("acme"), Kind: policy.Org, Plan: "pro"})
	b.create(t, policy.Account{ID: b.id("new-team"), Kind: policy.Team, Parent: b.id("acme"), Shadow: true})
	b.create(t, policy.Account{ID: b.id("new-agent"), Kind: policy.Agent, Parent: b.id("new-team")})
	b.create(t, policy.Account{ID: b.id("old-team"), Kind: policy.Team, Parent: b.id("acme")})
	a, err := b.store.GetAccount(b.ctx, b.id("new-team"))
	require.NoError(t, err)
	require.True(t, a.Shadow)
	b.reload(t)
	for id, want := range map[string]bool{"trial": true, "trial-user": true, "acme": false, "new-team": true, "new-agent": true, "old-team": false} {
		require.Equal(t, want, b.resolve(t, b.id(id)).Shadow, id)
	}

	a.Shadow = false
	_, err = b.store.UpdateAccount(b.ctx, a)
	require.NoError(t, err)
	b.reload(t)
	require.False(t, b.resolve(t, b.id("new-agent")).Shadow, "out of shadow mode")
}
