package gateways_test

import (
	"io"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/deploy/gateways"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/config"
)

// defaults are admit's settings with no environment: its address and the check's headers.
func defaults(t *testing.T) config.Admit {
	t.Helper()
	var c config.Admit
	l := config.NewLoader("admit", func(string) (string, bool) { return "", false }, io.Discard)
	c.Register(l)
	require.NoError(t, l.Parse(nil))
	return c
}

// The check's header names admit reads by default are the api package's defaults, which
// the shipped configurations send.
func TestCheckHeaderDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, api.DefaultCheckHeaders, api.CheckHeaders(defaults(t).Admission.Check))
}

// get walks a parsed YAML document along keys (map keys, or list indexes as "0", "1").
func get(t *testing.T, doc any, keys ...string) any {
	t.Helper()
	for i, k := range keys {
		switch v := doc.(type) {
		case map[string]any:
			next, ok := v[k]
			require.True(t, ok, "no %q at %s", k, strings.Join(keys[:i], "."))
			doc = next
		case []any:
			var n int
			for _, c := range k {
				n = n*10 + int(c-'0')
			}
			require.Less(t, n, len(v), "no item %s at %s", k, strings.Join(keys[:i], "."))
			doc = v[n]
		default:
			t.Fatalf("%s is not a map or a list", strings.Join(keys[:i], "."))
		}
	}
	return doc
}

func parseYAML(t *testing.T, name string) map[string]any {
	t.Helper()
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(shipped(t, name)), &doc), name)
	return doc
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	require.True(t, ok, "%v is not a list", v)
	var out []string
	for _, s := range list {
		out = append(out, s.(string))
	}
	return out
}

// The Traefik middleware (no Traefik binary here): the chain sets the service token in the
// check's token header, asks admit's check at its default address, copies the event and
// the RateLimit fields to the app, and removes the token before the app.
func TestTraefik(t *testing.T) {
	t.Parallel()
	doc := parseYAML(t, "traefik.yaml")
	mw := get(t, doc, "http", "middlewares")
	require.Equal(t, []string{"metergate-token", "metergate-check", "metergate-strip"},
		strs(t, get(t, mw, "metergate", "chain", "middlewares")), "set the token, check, strip the token: in that order")

	h := api.DefaultCheckHeaders
	set := get(t, mw, "metergate-token", "headers", "customRequestHeaders").(map[string]any)
	require.Equal(t, `{{ env "ADMIT_SERVICE_TOKEN" }}`, set[h.Token])
	require.Equal(t, "", set["X-Account"], "clients cannot name an account")
	require.Equal(t, map[string]any{h.Token: ""}, get(t, mw, "metergate-strip", "headers", "customRequestHeaders"),
		"the app never sees the service token")

	fa := get(t, mw, "metergate-check", "forwardAuth")
	addr, err := url.Parse(get(t, fa, "address").(string))
	require.NoError(t, err)
	require.Equal(t, "http", addr.Scheme)
	require.Equal(t, defaults(t).Server.Addr, addr.Host, "admit's default address (ADMIT_ADDR)")
	require.Equal(t, "/v1/check", addr.Path)
	require.Equal(t, false, get(t, fa, "trustForwardHeader"))
	copied := strs(t, get(t, fa, "authResponseHeaders"))
	for _, want := range []string{api.EventIDHeader, api.AccountHeader, "RateLimit", "RateLimit-Policy"} {
		require.Contains(t, copied, want)
	}
	require.ElementsMatch(t, []string{api.DefaultCheckHeaders.APIKey, api.DefaultCheckHeaders.Token}, strs(t, get(t, fa, "authRequestHeaders")),
		"only the key and the token reach admit: a client decides nothing it is charged")
	require.Equal(t, []string{"metergate"}, strs(t, get(t, doc, "http", "routers", "app", "middlewares")))
}

// The Envoy ext_authz snippet: the check at admit's default address with Envoy's
// path_prefix, the default headers let through, the token added, the event to the app and
// the RateLimit fields and Retry-After to the client.
func TestEnvoyExtAuthz(t *testing.T) {
	t.Parallel()
	doc := parseYAML(t, "envoy-ext-authz.yaml")
	cfg := get(t, doc, "http_filters", "0", "typed_config")
	require.Equal(t, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz", get(t, cfg, "@type"))
	require.Equal(t, false, get(t, cfg, "failure_mode_allow"))
	svc := get(t, cfg, "http_service")
	require.Equal(t, "/v1/check", get(t, svc, "path_prefix"))
	require.Equal(t, "metergate_admit", get(t, svc, "server_uri", "cluster"))

	patterns := func(keys ...string) []string {
		var out []string
		for _, p := range get(t, svc, keys...).([]any) {
			m := p.(map[string]any)
			require.Equal(t, true, m["ignore_case"], "%v", m)
			out = append(out, strings.ToLower(m["exact"].(string)))
		}
		return out
	}
	h := api.DefaultCheckHeaders
	require.Equal(t, []string{strings.ToLower(h.APIKey)}, patterns("authorization_request", "allowed_headers", "patterns"),
		"only the key reaches admit: a client decides nothing it is charged")
	require.Equal(t, h.Token, get(t, svc, "authorization_request", "headers_to_add", "0", "key"))
	require.Equal(t, "${ADMIT_SERVICE_TOKEN}", get(t, svc, "authorization_request", "headers_to_add", "0", "value"))
	require.Subset(t, patterns("authorization_response", "allowed_upstream_headers", "patterns"),
		[]string{strings.ToLower(api.EventIDHeader), strings.ToLower(api.AccountHeader)})
	require.Subset(t, patterns("authorization_response", "allowed_client_headers", "patterns"),
		[]string{"retry-after", "ratelimit", "ratelimit-policy", "content-type"})
	require.Subset(t, patterns("authorization_response", "allowed_client_headers_on_success", "patterns"),
		[]string{"ratelimit", "ratelimit-policy"})

	cluster := get(t, doc, "clusters", "0")
	require.Equal(t, "metergate_admit", get(t, cluster, "name"))
	sock := get(t, cluster, "load_assignment", "endpoints", "0", "lb_endpoints", "0", "endpoint", "address", "socket_address")
	host, port, err := net.SplitHostPort(defaults(t).Server.Addr)
	require.NoError(t, err)
	require.Equal(t, host, get(t, sock, "address"))
	require.Equal(t, port, strings.TrimSpace(strings.Trim(yamlString(t, get(t, sock, "port_value")), `"`)))
}

func yamlString(t *testing.T, v any) string {
	t.Helper()
	raw, err := yaml.Marshal(v)
	require.NoError(t, err)
	return string(raw)
}

// nginx.conf and the Envoy snippet take only the documented ${NAME} values (nginx's own
// $variables aside); the Caddyfile's {$NAME} are the same, plus Caddy's own settings.
func TestTemplateVariables(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"nginx.conf", "envoy-ext-authz.yaml"} {
		for _, m := range regexp.MustCompile(`\$\{([A-Z_]+)\}`).FindAllStringSubmatch(shipped(t, name), -1) {
			require.Contains(t, gateways.Vars, m[1], name)
		}
	}
	for _, m := range regexp.MustCompile(`\{\$([A-Z_]+)[:}]`).FindAllStringSubmatch(shipped(t, "Caddyfile"), -1) {
		require.True(t, slices.Contains(gateways.Vars, m[1]) || strings.HasPrefix(m[1], "CADDY_"), "Caddyfile: %s", m[1])
	}
	require.Contains(t, shipped(t, "Caddyfile"), "{$ADMIT_ADDR:"+defaults(t).Server.Addr+"}", "admit's default address")
}
