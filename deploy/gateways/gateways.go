// Package gateways holds the forward-auth configurations that put admit's check
// (GET /v1/check) in front of an app: nginx (auth_request), Caddy (forward_auth), Traefik
// (ForwardAuth) and Envoy (ext_authz over HTTP); docs/gateways.md explains them. Its tests
// run the nginx and Caddy files with the real servers in front of a real admit.
package gateways

import (
	"embed"
	"strings"
)

// Files are the shipped configurations, as they are in this directory.
//
//go:embed nginx.conf Caddyfile traefik.yaml envoy-ext-authz.yaml
var Files embed.FS

// Vars are the ${NAME} values of nginx.conf and envoy-ext-authz.yaml (the names envsubst
// is given; nginx's own $variables are left alone).
var Vars = []string{"METERGATE_LISTEN", "ADMIT_ADDR", "UPSTREAM_ADDR", "ADMIT_SERVICE_TOKEN"}

// Render replaces each ${NAME} of Vars in a configuration with values[NAME], as
// `envsubst '$METERGATE_LISTEN $ADMIT_ADDR ...'` does.
func Render(conf string, values map[string]string) string {
	pairs := make([]string, 0, 2*len(Vars))
	for _, name := range Vars {
		if v, ok := values[name]; ok {
			pairs = append(pairs, "${"+name+"}", v)
		}
	}
	return strings.NewReplacer(pairs...).Replace(conf)
}
