package deploy_test

import (
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/internal/config"
)

type compose struct {
	Services map[string]struct {
		Image       string                                `yaml:"image"`
		Build       *struct{ Context, Dockerfile string } `yaml:"build"`
		Command     []string                              `yaml:"command"`
		Environment map[string]string                     `yaml:"environment"`
		Ports       []string                              `yaml:"ports"`
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

// interpolation is Compose's ${VAR:-default} (and ${VAR-default}); the tests take the default.
var interpolation = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}`)

// checkComposeAgreement loads each binary's configuration from docker-compose.yml as the
// binary would and lists where the services disagree: admit, reconcile and close must name
// the same Redis counters (ADMIT_KEY_PREFIX, ADMIT_SHARDS), admit and meter the same topic,
// all of them the same database; admit and meter must listen where their ports are published.
func checkComposeAgreement(raw []byte) (problems, error) {
	var p problems
	var c compose
	if err := yaml.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	cfgs := map[string]config.Config{}
	for _, svc := range []string{"admit", "meter", "reconcile", "close"} {
		s, ok := c.Services[svc]
		if !ok {
			p.add("service %s missing", svc)
			continue
		}
		b, err := binaryOf(container{Command: s.Command})
		if err != nil {
			p.add("%s: %v", svc, err)
			continue
		}
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = interpolation.ReplaceAllString(v, "$1")
		}
		if _, err := config.Load(b.cfg, b.name, b.args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
			p.add("%s: %s refuses its environment: %v", svc, b.name, err)
		}
		cfgs[svc] = b.cfg
		if srv, addrEnv, ok := server(b.cfg); ok {
			host, port, err := net.SplitHostPort(srv.Addr)
			if ip := net.ParseIP(host); err != nil || host == "localhost" || (ip != nil && ip.IsLoopback()) {
				p.add("%s: %s=%s: want 0.0.0.0:<port>, reachable from outside the container", svc, addrEnv, srv.Addr)
			}
			published := false
			for _, ports := range s.Ports {
				published = published || strings.HasSuffix(ports, ":"+port)
			}
			if !published {
				p.add("%s: listens on port %s (%s) but publishes %v", svc, port, addrEnv, s.Ports)
			}
		}
	}
	admit, okA := cfgs["admit"].(*config.Admit)
	meter, okM := cfgs["meter"].(*config.Meter)
	if !okA || !okM {
		p.add("admit or meter does not run its binary")
		return p, nil
	}
	for _, svc := range []string{"reconcile", "close"} {
		r, ok := cfgs[svc].(*config.Reconcile)
		if !ok {
			p.add("%s does not run /reconcile", svc)
			continue
		}
		if r.KeyPrefix != admit.Admission.KeyPrefix || r.Shards != admit.Admission.Shards {
			p.add("%s: ADMIT_KEY_PREFIX %q and ADMIT_SHARDS %d differ from admit's %q and %d: it would correct counters admit does not use",
				svc, r.KeyPrefix, r.Shards, admit.Admission.KeyPrefix, admit.Admission.Shards)
		}
		if r.Postgres.URL != admit.Postgres.URL || r.Redis.URL != admit.Redis.URL {
			p.add("%s: DATABASE_URL or REDIS_URL differs from admit's", svc)
		}
	}
	if !slices.Equal(admit.Kafka.Brokers, meter.Kafka.Brokers) || admit.Kafka.Spec() != meter.Kafka.Spec() {
		p.add("admit and meter disagree on Kafka: admit %v %+v, meter %v %+v", admit.Kafka.Brokers, admit.Kafka.Spec(), meter.Kafka.Brokers, meter.Kafka.Spec())
	}
	if admit.Postgres.URL != meter.Postgres.URL {
		p.add("admit and meter disagree on DATABASE_URL")
	}
	return p, nil
}

func TestComposeAgrees(t *testing.T) {
	raw, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	p, err := checkComposeAgreement(raw)
	require.NoError(t, err)
	require.Empty(t, p, "docker-compose.yml:\n%s", strings.Join(p, "\n"))

	// Each check catches its mistake.
	for _, tc := range []struct{ name, old, new, want string }{
		{"shards", "      ADMIT_SHARDS: 16\n      LOG_FORMAT: json\n    depends_on:\n      redis: {condition: service_healthy}\n      postgres: {condition: service_healthy}\n\n  # One-shot: `docker compose run --rm close`",
			"      ADMIT_SHARDS: 32\n      LOG_FORMAT: json\n    depends_on:\n      redis: {condition: service_healthy}\n      postgres: {condition: service_healthy}\n\n  # One-shot: `docker compose run --rm close`", "reconcile: ADMIT_KEY_PREFIX"},
		{"topic", "      KAFKA_TOPIC: usage.events\n      KAFKA_TOPIC_PARTITIONS: 12\n      METER_GROUP", "      KAFKA_TOPIC: usage\n      KAFKA_TOPIC_PARTITIONS: 12\n      METER_GROUP", "disagree on Kafka"},
		{"loopback", "ADMIT_ADDR: 0.0.0.0:8080", "ADMIT_ADDR: 127.0.0.1:8080", "want 0.0.0.0"},
		{"port", `ports: ["8081:8081"]`, `ports: ["8081:9090"]`, "publishes"},
		{"token", "${ADMIT_ADMIN_TOKEN:-change-me-admin-token}", "${ADMIT_ADMIN_TOKEN:-short}", "admit refuses"},
	} {
		mutated := strings.Replace(string(raw), tc.old, tc.new, 1)
		require.NotEqual(t, string(raw), mutated, "%s: the mutation no longer applies", tc.name)
		p, err := checkComposeAgreement([]byte(mutated))
		require.NoError(t, err)
		require.True(t, containsProblem(p, tc.want), "%s: want a problem containing %q, got %q", tc.name, tc.want, p)
	}
}
