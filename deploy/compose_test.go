package deploy_test

import (
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/pkg/config"
)

type compose struct {
	Services map[string]struct {
		Image       string                                `yaml:"image"`
		Build       *struct{ Context, Dockerfile string } `yaml:"build"`
		Command     []string                              `yaml:"command"`
		Environment map[string]string                     `yaml:"environment"`
		DependsOn   map[string]any                        `yaml:"depends_on"`
	} `yaml:"services"`
}

func names(c config.Registrar) []string {
	l := config.NewLoader("x", func(string) (string, bool) { return "", false }, io.Discard)
	c.Register(l)
	return l.Names()
}

// docker-compose.yml cannot run on the development machines (no Docker engine); this keeps
// it valid and its environment in step with what each binary reads.
func TestComposeMatchesBinaries(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var c compose
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	require.NoError(t, dec.Decode(&c))

	for svc, image := range map[string]string{"redis": "redis:7", "postgres": "postgres:16", "kafka": "apache/kafka:"} {
		require.Contains(t, c.Services, svc)
		require.True(t, strings.HasPrefix(c.Services[svc].Image, image), "%s image %q", svc, c.Services[svc].Image)
	}

	binaries := map[string]config.Registrar{"admit": &config.Admit{}, "meter": &config.Meter{}, "reconcile": &config.Reconcile{}}
	for name, cfg := range binaries {
		s, ok := c.Services[name]
		require.True(t, ok, "service %s missing", name)
		require.NotNil(t, s.Build, "%s is built from deploy/Dockerfile", name)
		require.Equal(t, "deploy/Dockerfile", s.Build.Dockerfile)
		require.NotEmpty(t, s.Command)
		require.Equal(t, "/"+name, s.Command[0])
		known := names(cfg)
		for env := range s.Environment {
			require.True(t, slices.Contains(known, env), "%s sets %s, which %s does not read (it reads %v)", name, env, name, known)
		}
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = v
		}
		// The values parse and validate as the binary itself would take them.
		_, err := config.Load(cfg.(config.Config), name, nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard)
		require.NoError(t, err, "%s environment in docker-compose.yml", name)
		for dep := range s.DependsOn {
			require.Contains(t, c.Services, dep, "%s depends on unknown service %s", name, dep)
		}
	}
	// The monthly close is reconcile's close subcommand, configured as reconcile.
	closeSvc, ok := c.Services["close"]
	require.True(t, ok, "service close missing")
	require.Equal(t, []string{"/reconcile", "close"}, closeSvc.Command[:2])
	require.Equal(t, c.Services["reconcile"].Environment, closeSvc.Environment)
	_, err = os.Stat("Dockerfile")
	require.NoError(t, err)
}
