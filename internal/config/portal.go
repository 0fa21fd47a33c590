package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/console"
)

// Portal is the customer portal's section of admit (docs/portal.md#the-portal-pages).
type Portal struct {
	// Enabled serves the portal at /portal/.
	Enabled bool
	// Brand names the operator in the portal's pages.
	Brand string
	// Color is the brand's color, #rrggbb.
	Color string
	// TopUpURL is the balance's top-up link; "{account}" in it is the account's id.
	TopUpURL string
	// PublicURL is the base of portal session links (https://admit.example); empty: the
	// links are paths of this host.
	PublicURL string
}

// Register adds the portal's settings to l.
func (c *Portal) Register(l *Loader) {
	l.Bool(&c.Enabled, "PORTAL_ENABLED", true, "serve the customer portal at /portal/ (customers open it by a portal session's link)")
	l.String(&c.Brand, "PORTAL_BRAND_NAME", "", "your name in the portal's pages (\"Back to Acme Cloud\"); empty: \"Back to your provider\"")
	l.String(&c.Color, "PORTAL_BRAND_COLOR", console.DefaultPortalColor, "your brand's color in the portal, #rrggbb")
	l.String(&c.TopUpURL, "PORTAL_TOPUP_URL", "", "where the portal's top-up link goes, an http(s) URL; {account} in it is the account's id; empty: no link")
	l.String(&c.PublicURL, "PORTAL_PUBLIC_URL", "", "the base of portal session links (https://admit.example); empty: the links are paths of this host")
}

// Validate checks the color and the URLs.
func (c Portal) Validate() error {
	var errs []error
	if !console.ValidColor(c.Color) {
		errs = append(errs, fmt.Errorf("PORTAL_BRAND_COLOR=%q: want #rrggbb", c.Color))
	}
	if c.TopUpURL != "" && !httpURL(strings.ReplaceAll(c.TopUpURL, "{account}", "acme"), true) {
		errs = append(errs, fmt.Errorf("PORTAL_TOPUP_URL=%q: want an absolute http(s) URL", c.TopUpURL))
	}
	if c.PublicURL != "" && !httpURL(c.PublicURL, false) {
		errs = append(errs, fmt.Errorf("PORTAL_PUBLIC_URL=%q: want an absolute http(s) URL without a query (https://admit.example)", c.PublicURL))
	}
	if len(c.Brand) > 100 {
		errs = append(errs, errors.New("PORTAL_BRAND_NAME: at most 100 bytes"))
	}
	return prefix("portal", errs)
}

// httpURL reports whether s is an absolute http or https URL with a host and no user
// info; with query false, without a query or fragment either.
func httpURL(s string, query bool) bool {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return false
	}
	return query || (u.RawQuery == "" && u.Fragment == "" && !strings.ContainsAny(s, "?#"))
}

// PortalConfig returns cfg with the portal's settings; insecure is CONSOLE_INSECURE_COOKIES
// (the portal's cookie follows the console's).
func (c Portal) PortalConfig(cfg console.PortalConfig, insecure bool) console.PortalConfig {
	cfg.Brand, cfg.Color, cfg.TopUpURL, cfg.InsecureCookies = c.Brand, c.Color, c.TopUpURL, insecure
	return cfg
}

// APIConfig returns o with the base of portal session links.
func (c Portal) APIConfig(o api.Config) api.Config {
	o.PortalURL = c.PublicURL
	return o
}
