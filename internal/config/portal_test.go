package config_test

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/console"
)

// The portal's settings reach the portal and the API; a color that is not #rrggbb and URLs
// that are not absolute http(s) ones are refused, each by name.
func TestPortal(t *testing.T) {
	var c config.Admit
	_, err := config.Load(&c, "admit", nil, envMap(map[string]string{"PORTAL_BRAND_NAME": "Acme Cloud",
		"PORTAL_BRAND_COLOR": "#6F42c1", "PORTAL_TOPUP_URL": "https://cloud.example/top-up?account={account}",
		"PORTAL_PUBLIC_URL": "https://admit.example", "CONSOLE_INSECURE_COOKIES": "true"}), io.Discard)
	require.NoError(t, err)
	require.True(t, c.Portal.Enabled)
	p := c.Portal.PortalConfig(console.PortalConfig{}, c.Console.InsecureCookies)
	require.Equal(t, console.PortalConfig{Brand: "Acme Cloud", Color: "#6F42c1",
		TopUpURL: "https://cloud.example/top-up?account={account}", InsecureCookies: true}, p)
	require.Equal(t, "https://admit.example", c.Portal.APIConfig(api.Config{}).PortalURL)

	var d config.Admit
	_, err = config.Load(&d, "admit", nil, envMap(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, console.DefaultPortalColor, d.Portal.Color)
	require.Empty(t, d.Portal.PublicURL)

	for _, tt := range []struct{ env, value string }{
		{"PORTAL_BRAND_COLOR", "red"},
		{"PORTAL_BRAND_COLOR", "#6f42c"},
		{"PORTAL_BRAND_COLOR", "#6f42c1;}body{"},
		{"PORTAL_TOPUP_URL", "/top-up"},
		{"PORTAL_TOPUP_URL", "javascript:alert(1)"},
		{"PORTAL_PUBLIC_URL", "admit.example"},
		{"PORTAL_PUBLIC_URL", "https://admit.example/?x=1"},
		{"PORTAL_PUBLIC_URL", "https://user@admit.example"},
	} {
		var c config.Admit
		_, err := config.Load(&c, "admit", nil, envMap(map[string]string{tt.env: tt.value}), io.Discard)
		require.Error(t, err, "%s=%s", tt.env, tt.value)
		require.Contains(t, err.Error(), "portal: "+tt.env, tt.value)
	}
}
