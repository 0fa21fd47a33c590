package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// Every route the server answers is in openapi.yaml, and every operation there is served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                    `yaml:"openapi"`
		Paths   map[string]map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(openAPI, &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."))

	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			documented[strings.ToUpper(method)+" "+path] = true
			fields, ok := op.(map[string]any)
			require.True(t, ok, "%s %s is not an operation object", method, path)
			require.Contains(t, fields, "responses", "%s %s has no responses", method, path)
		}
	}
	// Routes without a method (the forward-auth check) are documented for every method,
	// {path...} as {path} (Operations).
	served := map[string]bool{}
	for _, op := range Operations() {
		served[op] = true
		require.True(t, documented[op], "route %q is not in openapi.yaml", op)
	}
	for op := range documented {
		require.True(t, served[op], "openapi.yaml documents %q, which is not served", op)
	}
}
