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
	served := map[string]bool{}
	anyMethod := map[string]bool{} // routes without a method (the forward-auth check)
	for _, r := range Routes {
		if !strings.Contains(r, " ") {
			// Documented for every method; {path...} is {path} to OpenAPI.
			p := strings.ReplaceAll(r, "...}", "}")
			anyMethod[p] = true
			for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
				require.True(t, documented[m+" "+p], "route %q is not in openapi.yaml for %s", r, m)
			}
			continue
		}
		served[r] = true
		require.True(t, documented[r], "route %q is not in openapi.yaml", r)
	}
	for op := range documented {
		_, path, _ := strings.Cut(op, " ")
		require.True(t, served[op] || anyMethod[path], "openapi.yaml documents %q, which is not served", op)
	}
}
