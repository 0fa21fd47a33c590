package api

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A link is below PORTAL_PUBLIC_URL (with or without its trailing slash), or a path.
func TestPortalLink(t *testing.T) {
	t.Parallel()
	require.Equal(t, "/portal/session/mgp_x", portalLink("", "mgp_x"))
	require.Equal(t, "https://admit.example/portal/session/mgp_x", portalLink("https://admit.example", "mgp_x"))
	require.Equal(t, "https://admit.example/base/portal/session/mgp_x", portalLink("https://admit.example/base/", "mgp_x"))
}
