package deploy_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/ops"
)

// There is no kubectl nor cluster on the development machines: these tests parse
// deploy/k8s and check it against the binaries themselves — the variables each one reads
// (internal/config), the paths it serves (internal/ops) and the values it accepts (config.Load).

// readyzTimeout is internal/ops' default bound of one /readyz call (Probes.Timeout zero): a
// readiness probe must wait longer, or a hanging degraded check (Redis down) would make
// admit unready, which the degraded checks exist to avoid.
const readyzTimeout = 2 * time.Second

// migrateURL is the schema owner's URL: the migrate init containers' alone
// (docs/deploy.md#database-roles).
const migrateURL = "DATABASE_MIGRATE_URL"

// secretEnv is the variable each key of the Secret metergate is for.
var secretEnv = map[string]string{
	"database-url":         "DATABASE_URL",
	"database-migrate-url": "DATABASE_MIGRATE_URL",
	"redis-url":            "REDIS_URL",
	"admit-service-token":  "ADMIT_SERVICE_TOKEN",
	"admit-admin-token":    "ADMIT_ADMIN_TOKEN",
}

type labelSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []any             `yaml:"matchExpressions"`
}

type keyRef struct {
	Name     string `yaml:"name"`
	Key      string `yaml:"key"`
	Optional *bool  `yaml:"optional"`
}

type envVar struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
		ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		FieldRef        *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		ResourceFieldRef any `yaml:"resourceFieldRef"`
	} `yaml:"valueFrom"`
}

type envFrom struct {
	Prefix       string `yaml:"prefix"`
	ConfigMapRef *struct {
		Name string `yaml:"name"`
	} `yaml:"configMapRef"`
	SecretRef *struct {
		Name string `yaml:"name"`
	} `yaml:"secretRef"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
	TimeoutSeconds   int `yaml:"timeoutSeconds"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

type securityContext struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	Privileged               *bool `yaml:"privileged"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	Capabilities             *struct {
		Drop []string `yaml:"drop"`
		Add  []string `yaml:"add"`
	} `yaml:"capabilities"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env            []envVar  `yaml:"env"`
	EnvFrom        []envFrom `yaml:"envFrom"`
	StartupProbe   *probe    `yaml:"startupProbe"`
	ReadinessProbe *probe    `yaml:"readinessProbe"`
	LivenessProbe  *probe    `yaml:"livenessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
			Exec    any `yaml:"exec"`
			HTTPGet any `yaml:"httpGet"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *securityContext `yaml:"securityContext"`
}

type podTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		SecurityContext               *securityContext `yaml:"securityContext"`
		InitContainers                []container      `yaml:"initContainers"`
		Containers                    []container      `yaml:"containers"`
		TerminationGracePeriodSeconds *int             `yaml:"terminationGracePeriodSeconds"`
		RestartPolicy                 string           `yaml:"restartPolicy"`
	} `yaml:"spec"`
}

type deployment struct {
	Spec struct {
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type cronJob struct {
	Spec struct {
		Schedule          string `yaml:"schedule"`
		ConcurrencyPolicy string `yaml:"concurrencyPolicy"`
		JobTemplate       struct {
			Spec struct {
				Template podTemplate `yaml:"template"`
			} `yaml:"spec"`
		} `yaml:"jobTemplate"`
	} `yaml:"spec"`
}

type service struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

type pdb struct {
	Spec struct {
		MinAvailable   any           `yaml:"minAvailable"`
		MaxUnavailable any           `yaml:"maxUnavailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

// object is one document of a manifest.
type object struct {
	File       string `yaml:"-"`
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string `yaml:"name"`
		Namespace string `yaml:"namespace"`
	} `yaml:"metadata"`
	node yaml.Node
}

func (o object) String() string { return fmt.Sprintf("%s %s/%s", o.File, o.Kind, o.Metadata.Name) }

// workload is a Deployment's or a CronJob's pod template.
type workload struct {
	obj      object
	pod      podTemplate
	replicas int // Deployments
	selector labelSelector
}

// cluster is everything kustomization.yaml lists, parsed.
type cluster struct {
	files       []string
	objects     []object
	configMaps  map[string]map[string]string
	secrets     map[string]map[string]string
	deployments []workload
	cronJobs    []workload
	services    map[string]service
	pdbs        map[string]pdb
}

// problems collects every mistake found, so that one run reports them all.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// load parses kustomization.yaml and every manifest it lists from dir.
func load(dir fs.FS) (*cluster, problems, error) {
	var p problems
	raw, err := fs.ReadFile(dir, "kustomization.yaml")
	if err != nil {
		return nil, nil, err
	}
	var k struct {
		Resources  []string `yaml:"resources"`
		Namespace  string   `yaml:"namespace"`
		Images     []struct{ Name string }
		NamePrefix string `yaml:"namePrefix"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if k.Namespace != "" || k.NamePrefix != "" {
		p.add("kustomization.yaml: namespace/namePrefix set: the base is namespace-agnostic and the checks below assume the names as written")
	}
	if !slices.ContainsFunc(k.Images, func(i struct{ Name string }) bool { return i.Name == "metergate" }) {
		p.add("kustomization.yaml: no images entry for metergate (kustomize edit set image needs it)")
	}
	entries, err := fs.ReadDir(dir, ".")
	if err != nil {
		return nil, nil, err
	}
	var onDisk []string
	for _, e := range entries {
		if ext := path.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") && e.Name() != "kustomization.yaml" {
			onDisk = append(onDisk, e.Name())
		}
	}
	for _, f := range onDisk {
		if !slices.Contains(k.Resources, f) {
			p.add("kustomization.yaml: resources does not list %s", f)
		}
	}
	c := &cluster{configMaps: map[string]map[string]string{}, secrets: map[string]map[string]string{},
		services: map[string]service{}, pdbs: map[string]pdb{}}
	seen := map[string]bool{}
	for _, f := range k.Resources {
		if seen[f] {
			p.add("kustomization.yaml: %s listed twice", f)
		}
		seen[f] = true
		raw, err := fs.ReadFile(dir, f)
		if err != nil {
			p.add("kustomization.yaml lists %s: %v", f, err)
			continue
		}
		c.files = append(c.files, f)
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		for {
			var o object
			if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(o.node.Content) == 0 { // a document of comments only
				continue
			}
			if err := o.node.Decode(&o); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			o.File = f
			if err := c.add(o, &p); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", o, err)
			}
		}
	}
	return c, p, nil
}

func (c *cluster) add(o object, p *problems) error {
	if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
		p.add("%s: apiVersion, kind and metadata.name are required", o)
	}
	if o.Metadata.Namespace != "" {
		p.add("%s: sets metadata.namespace %q; the manifests are namespace-agnostic", o, o.Metadata.Namespace)
	}
	for _, other := range c.objects {
		if other.Kind == o.Kind && other.Metadata.Name == o.Metadata.Name {
			p.add("%s: defined twice (also in %s)", o, other.File)
		}
	}
	c.objects = append(c.objects, o)
	want := map[string]string{"ConfigMap": "v1", "Secret": "v1", "Service": "v1", "Deployment": "apps/v1",
		"CronJob": "batch/v1", "PodDisruptionBudget": "policy/v1"}
	if v, ok := want[o.Kind]; !ok {
		p.add("%s: kind %s is not one these tests know how to check", o, o.Kind)
		return nil
	} else if v != o.APIVersion {
		p.add("%s: apiVersion %s, want %s", o, o.APIVersion, v)
	}
	switch o.Kind {
	case "ConfigMap":
		var cm struct {
			Data map[string]string `yaml:"data"`
		}
		if err := o.node.Decode(&cm); err != nil {
			return err
		}
		c.configMaps[o.Metadata.Name] = cm.Data
	case "Secret":
		var s struct {
			Data       map[string]string `yaml:"data"`
			StringData map[string]string `yaml:"stringData"`
		}
		if err := o.node.Decode(&s); err != nil {
			return err
		}
		values := map[string]string{}
		for k, v := range s.Data {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				p.add("%s: data.%s is not base64", o, k)
			}
			values[k] = string(b)
		}
		for k, v := range s.StringData {
			values[k] = v
		}
		c.secrets[o.Metadata.Name] = values
	case "Deployment":
		var d deployment
		if err := o.node.Decode(&d); err != nil {
			return err
		}
		replicas := 1
		if d.Spec.Replicas != nil {
			replicas = *d.Spec.Replicas
		}
		c.deployments = append(c.deployments, workload{obj: o, pod: d.Spec.Template, replicas: replicas, selector: d.Spec.Selector})
	case "CronJob":
		var cj cronJob
		if err := o.node.Decode(&cj); err != nil {
			return err
		}
		if cj.Spec.Schedule == "" || cj.Spec.ConcurrencyPolicy != "Forbid" {
			p.add("%s: needs a schedule and concurrencyPolicy Forbid (two runs must not overlap)", o)
		}
		if rp := cj.Spec.JobTemplate.Spec.Template.Spec.RestartPolicy; rp != "Never" && rp != "OnFailure" {
			p.add("%s: restartPolicy %q, want Never or OnFailure", o, rp)
		}
		c.cronJobs = append(c.cronJobs, workload{obj: o, pod: cj.Spec.JobTemplate.Spec.Template})
	case "Service":
		var s service
		if err := o.node.Decode(&s); err != nil {
			return err
		}
		c.services[o.Metadata.Name] = s
	case "PodDisruptionBudget":
		var b pdb
		if err := o.node.Decode(&b); err != nil {
			return err
		}
		c.pdbs[o.Metadata.Name] = b
	}
	return nil
}

// binary is what a container runs, from its command and args.
type binary struct {
	name string // admit, meter or reconcile
	sub  string // the subcommand: relay (admit); migrate, verify, close, invoice, run (reconcile)
	args []string
	cfg  config.Config
}

func binaryOf(ctr container) (binary, error) {
	argv := append(slices.Clone(ctr.Command), ctr.Args...)
	if len(ctr.Command) == 0 {
		return binary{}, errors.New("no command: name the binary (/admit, /meter or /reconcile) rather than rely on the image's CMD")
	}
	b := binary{args: argv[1:]}
	switch argv[0] {
	case "/admit":
		b.name, b.cfg = "admit", &config.Admit{}
		if len(b.args) > 0 && b.args[0] == "relay" {
			b.sub, b.args = "relay", b.args[1:]
		}
	case "/meter":
		b.name, b.cfg = "meter", &config.Meter{}
	case "/reconcile":
		b.name, b.cfg, b.sub = "reconcile", &config.Reconcile{}, "run"
		if len(b.args) > 0 && slices.Contains([]string{"run", "migrate", "verify", "close", "invoice"}, b.args[0]) {
			b.sub, b.args = b.args[0], b.args[1:]
		}
	default:
		return binary{}, fmt.Errorf("command %q: the image holds /admit, /meter and /reconcile", argv[0])
	}
	return b, nil
}

// server is the listener of a binary that serves HTTP, once its configuration is loaded.
func server(cfg config.Config) (config.Server, string, bool) {
	switch c := cfg.(type) {
	case *config.Admit:
		return c.Server, "ADMIT_ADDR", true
	case *config.Meter:
		return c.Server, "METER_ADDR", true
	}
	return config.Server{}, "", false
}

// source names where a variable's value comes from, to compare containers.
func source(e envVar) string {
	switch {
	case e.ValueFrom == nil:
		return "literal"
	case e.ValueFrom.SecretKeyRef != nil:
		return "secret " + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
	case e.ValueFrom.ConfigMapKeyRef != nil:
		return "configmap " + e.ValueFrom.ConfigMapKeyRef.Name + "/" + e.ValueFrom.ConfigMapKeyRef.Key
	case e.ValueFrom.FieldRef != nil:
		return "field " + e.ValueFrom.FieldRef.FieldPath
	}
	return "other"
}

// resolveEnv gives a container's environment as the kubelet would, with the values of the
// ConfigMaps and Secrets; pod fields become placeholders.
func (c *cluster) resolveEnv(where string, ctr container, p *problems) map[string]string {
	env := map[string]string{}
	for _, ef := range ctr.EnvFrom {
		var data map[string]string
		var ok bool
		switch {
		case ef.ConfigMapRef != nil:
			data, ok = c.configMaps[ef.ConfigMapRef.Name]
		case ef.SecretRef != nil:
			data, ok = c.secrets[ef.SecretRef.Name]
		}
		if !ok {
			p.add("%s: envFrom names a ConfigMap or Secret not in the manifests", where)
			continue
		}
		for k, v := range data {
			env[ef.Prefix+k] = v
		}
	}
	seen := map[string]bool{}
	for _, e := range ctr.Env {
		if seen[e.Name] {
			p.add("%s: %s set twice", where, e.Name)
		}
		seen[e.Name] = true
		switch vf := e.ValueFrom; {
		case vf == nil && e.Value != nil:
			env[e.Name] = *e.Value
		case vf == nil:
			env[e.Name] = ""
		case vf.SecretKeyRef != nil:
			ref := vf.SecretKeyRef
			s, ok := c.secrets[ref.Name]
			if !ok {
				p.add("%s: %s: secretKeyRef names Secret %q, which the manifests do not define", where, e.Name, ref.Name)
				continue
			}
			v, ok := s[ref.Key]
			if !ok {
				p.add("%s: %s: secretKeyRef key %q is not in Secret %s", where, e.Name, ref.Key, ref.Name)
				continue
			}
			if want, ok := secretEnv[ref.Key]; ok && want != e.Name {
				p.add("%s: %s takes Secret key %s, which holds %s", where, e.Name, ref.Key, want)
			}
			env[e.Name] = v
		case vf.ConfigMapKeyRef != nil:
			ref := vf.ConfigMapKeyRef
			cm, ok := c.configMaps[ref.Name]
			if !ok {
				p.add("%s: %s: configMapKeyRef names ConfigMap %q, which the manifests do not define", where, e.Name, ref.Name)
				continue
			}
			v, ok := cm[ref.Key]
			if !ok {
				p.add("%s: %s: configMapKeyRef key %q is not in ConfigMap %s", where, e.Name, ref.Key, ref.Name)
				continue
			}
			// The ConfigMap's keys are the variables themselves (so envFrom would work too).
			if ref.Key != e.Name {
				p.add("%s: %s takes ConfigMap key %s", where, e.Name, ref.Key)
			}
			env[e.Name] = v
		case vf.FieldRef != nil:
			switch vf.FieldRef.FieldPath {
			case "metadata.name":
				env[e.Name] = "metergate-admit-7d9f8-abcde"
			case "metadata.namespace":
				env[e.Name] = "metergate"
			case "spec.nodeName":
				env[e.Name] = "node-1"
			case "status.podIP":
				env[e.Name] = "10.0.0.7"
			default:
				p.add("%s: %s: fieldRef %s is not one these tests resolve", where, e.Name, vf.FieldRef.FieldPath)
			}
		default:
			p.add("%s: %s: a valueFrom these tests do not resolve", where, e.Name)
		}
	}
	return env
}

func isTrue(b *bool) bool { return b != nil && *b }

func isFalse(b *bool) bool { return b != nil && !*b }

// checkContainer checks one container of a workload and returns the binary it runs with
// its loaded configuration.
func (c *cluster) checkContainer(w workload, ctr container, init bool, p *problems) (binary, bool) {
	where := fmt.Sprintf("%s container %s", w.obj, ctr.Name)
	b, err := binaryOf(ctr)
	if err != nil {
		p.add("%s: %v", where, err)
		return b, false
	}
	if name, _, _ := strings.Cut(ctr.Image, ":"); name != "metergate" {
		p.add("%s: image %q: want metergate[:tag], the name kustomization.yaml's images entry rewrites", where, ctr.Image)
	}

	// Every variable set is one the binary reads.
	known := names(b.cfg)
	env := c.resolveEnv(where, ctr, p)
	for name := range env {
		if !slices.Contains(known, name) {
			p.add("%s: sets %s, which %s does not read", where, name, b.name)
		}
	}
	// Shared settings come from the ConfigMap or the Secret, never a literal copy that could
	// drift from the others' (ADMIT_KEY_PREFIX and ADMIT_SHARDS of admit and reconcile, the
	// Kafka topic of admit and meter, ...); and a container sets every shared setting its
	// binary reads, so none falls back to a default that differs from the ConfigMap's.
	shared := map[string]bool{}
	for _, cm := range c.configMaps {
		for k := range cm {
			shared[k] = true
		}
	}
	for _, v := range secretEnv {
		shared[v] = true
	}
	set := map[string]envVar{}
	for _, e := range ctr.Env {
		set[e.Name] = e
	}
	for name := range shared {
		if !slices.Contains(known, name) {
			continue
		}
		e, ok := set[name]
		switch {
		case name == migrateURL && b.sub == "migrate" && !ok:
			p.add("%s: does not set %s: migrations would run as the services' role, which owns nothing", where, name)
		case name == migrateURL && b.sub != "migrate":
			if ok {
				p.add("%s: sets %s: only the migrate init containers hold the schema owner's credentials", where, name)
			}
		case !ok && b.sub == "migrate" && name != "DATABASE_URL":
			// `reconcile migrate` uses PostgreSQL only.
		case !ok:
			p.add("%s: does not set %s (from the ConfigMap or Secret), which %s reads", where, name, b.name)
		case e.ValueFrom == nil || (e.ValueFrom.ConfigMapKeyRef == nil && e.ValueFrom.SecretKeyRef == nil):
			p.add("%s: %s is a literal; take it from the ConfigMap or Secret metergate so every part agrees", where, name)
		}
	}

	// The configuration loads and validates as the binary itself would take it.
	if _, err := config.Load(b.cfg, b.name, b.args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard); err != nil {
		p.add("%s: %s refuses this configuration: %v", where, b.name, strings.ReplaceAll(err.Error(), "\n", "; "))
	}

	// Resources.
	for _, r := range []string{"cpu", "memory"} {
		if ctr.Resources.Requests[r] == "" {
			p.add("%s: no %s request", where, r)
		}
	}
	if ctr.Resources.Limits["memory"] == "" {
		p.add("%s: no memory limit", where)
	} else if req, lim := bytesOf(ctr.Resources.Requests["memory"]), bytesOf(ctr.Resources.Limits["memory"]); req < 0 || lim < 0 || req > lim {
		p.add("%s: memory request %s and limit %s: want quantities, request ≤ limit", where, ctr.Resources.Requests["memory"], ctr.Resources.Limits["memory"])
	}

	// Non-root, read-only, no privileges. The container's settings win over the pod's.
	pod, sc := w.pod.Spec.SecurityContext, ctr.SecurityContext
	if pod == nil {
		pod = &securityContext{}
	}
	if sc == nil {
		sc = &securityContext{}
	}
	nonRoot, user := pod.RunAsNonRoot, pod.RunAsUser
	if sc.RunAsNonRoot != nil {
		nonRoot = sc.RunAsNonRoot
	}
	if sc.RunAsUser != nil {
		user = sc.RunAsUser
	}
	if !isTrue(nonRoot) {
		p.add("%s: runAsNonRoot is not true", where)
	}
	if user != nil && *user == 0 {
		p.add("%s: runAsUser 0", where)
	}
	if isTrue(sc.Privileged) || !isFalse(sc.AllowPrivilegeEscalation) || !isTrue(sc.ReadOnlyRootFilesystem) {
		p.add("%s: want privileged unset or false, allowPrivilegeEscalation false, readOnlyRootFilesystem true", where)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		p.add("%s: want capabilities drop [ALL] and nothing added", where)
	}

	if init {
		if b.name != "reconcile" || b.sub != "migrate" {
			p.add("%s: an init container is for `/reconcile migrate` only", where)
		}
		if ctr.ReadinessProbe != nil || ctr.LivenessProbe != nil || ctr.StartupProbe != nil {
			p.add("%s: an init container has no probes", where)
		}
	}
	return b, true
}

// bytesOf parses a memory quantity (123, 64Ki, 256Mi, 1Gi, 1G); -1 when it cannot.
func bytesOf(q string) int64 {
	units := []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(q, u.suffix) {
			q, mult = strings.TrimSuffix(q, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n * mult
}

// portOf resolves a probe's or a Service's port (a number or a container port's name) among
// the containers' ports; 0 when it names none.
func portOf(port any, ctrs ...container) int {
	for _, ctr := range ctrs {
		for _, cp := range ctr.Ports {
			switch v := port.(type) {
			case int:
				if v == cp.ContainerPort {
					return v
				}
			case string:
				if v == cp.Name {
					return cp.ContainerPort
				}
				if n, err := strconv.Atoi(v); err == nil && n == cp.ContainerPort {
					return n
				}
			}
		}
	}
	return 0
}

// served is the set of paths internal/ops really answers (not 404/405) with GET.
func served() func(string) bool {
	mux := http.NewServeMux()
	(&ops.Probes{}).Mount(mux, ops.NewRegistry())
	return func(path string) bool {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code == http.StatusOK
	}
}

// checkServer checks what a long-running container serves: listen address, port,
// probes, graceful shutdown, Prometheus annotations.
func (c *cluster) checkServer(w workload, ctr container, b binary, serves func(string) bool, p *problems) {
	where := fmt.Sprintf("%s container %s", w.obj, ctr.Name)
	srv, addrEnv, ok := server(b.cfg)
	if !ok {
		p.add("%s: %s serves no HTTP: it cannot be a Deployment", where, b.name)
		return
	}
	host, portStr, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		return // Load reported it
	}
	listen, _ := strconv.Atoi(portStr)
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		p.add("%s: %s=%s listens on loopback only: the kubelet's probes and the Service cannot reach it (set %s=0.0.0.0:%d)", where, addrEnv, srv.Addr, addrEnv, listen)
	}
	if portOf(listen, ctr) == 0 {
		p.add("%s: listens on port %d (%s) but declares no such containerPort", where, listen, addrEnv)
	}
	for _, pr := range []struct {
		kind     string
		probe    *probe
		paths    []string
		required bool
	}{
		// Liveness on /readyz would restart every pod during a PostgreSQL or Kafka outage.
		{"livenessProbe", ctr.LivenessProbe, []string{"/healthz"}, true},
		{"readinessProbe", ctr.ReadinessProbe, []string{"/readyz"}, true},
		{"startupProbe", ctr.StartupProbe, []string{"/healthz", "/readyz"}, false},
	} {
		if pr.probe == nil {
			if pr.required {
				p.add("%s: no %s", where, pr.kind)
			}
			continue
		}
		if pr.probe.HTTPGet == nil {
			p.add("%s: %s is not an httpGet", where, pr.kind)
			continue
		}
		path := pr.probe.HTTPGet.Path
		if !slices.Contains(pr.paths, path) || !serves(path) {
			p.add("%s: %s on %q: want %v, served by internal/ops", where, pr.kind, path, pr.paths)
		}
		if port := portOf(pr.probe.HTTPGet.Port, ctr); port != listen {
			p.add("%s: %s port %v is not %s's port %d", where, pr.kind, pr.probe.HTTPGet.Port, addrEnv, listen)
		}
		timeout := time.Duration(max(pr.probe.TimeoutSeconds, 1)) * time.Second
		if path == "/readyz" && timeout <= readyzTimeout {
			p.add("%s: %s on /readyz times out after %s, not above /readyz's own %s bound", where, pr.kind, timeout, readyzTimeout)
		}
	}

	// SIGTERM arrives after preStop; the binary then takes up to SHUTDOWN_TIMEOUT.
	grace := 30 * time.Second
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	need := srv.ShutdownTimeout
	if ctr.Lifecycle != nil && ctr.Lifecycle.PreStop != nil {
		if ctr.Lifecycle.PreStop.Sleep == nil {
			p.add("%s: preStop other than sleep: the image has no shell", where)
		} else {
			need += time.Duration(ctr.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
	}
	if grace <= need {
		p.add("%s: terminationGracePeriodSeconds %s is not above preStop + SHUTDOWN_TIMEOUT (%s): the pod would be killed mid-shutdown", where, grace, need)
	}

	a := w.pod.Metadata.Annotations
	if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(listen) || a["prometheus.io/path"] != "/metrics" || !serves("/metrics") {
		p.add("%s: want annotations prometheus.io/scrape \"true\", prometheus.io/port %q, prometheus.io/path /metrics; have %v", w.obj, strconv.Itoa(listen), a)
	}
}

// selects reports whether a matchLabels selector selects pods with labels.
func selects(sel map[string]string, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// envKeys describes an environment by name, source and literal value, sorted.
func envKeys(env []envVar) []string {
	var out []string
	for _, e := range env {
		v := ""
		if e.Value != nil {
			v = *e.Value
		}
		out = append(out, e.Name+" "+source(e)+" "+v)
	}
	sort.Strings(out)
	return out
}

// check runs every check on a loaded cluster.
func (c *cluster) check(p *problems) {
	serves := served()

	if len(c.configMaps["metergate"]) == 0 {
		p.add("no ConfigMap metergate with data")
	}
	if _, ok := c.secrets["metergate"]; !ok {
		p.add("no Secret metergate")
	}
	for k := range c.secrets["metergate"] {
		if _, ok := secretEnv[k]; !ok {
			p.add("Secret metergate: key %s is none of %v", k, slices.Sorted(maps.Keys(secretEnv)))
		}
	}

	type run struct {
		w   workload
		ctr container
		b   binary
		env []envVar
	}
	var runs []run
	used := map[string]bool{} // "configmap name/key", "secret name/key"
	sources := map[string]map[string][]string{}
	visit := func(w workload, long bool) {
		pod := w.pod
		if len(pod.Spec.Containers) != 1 {
			p.add("%s: want exactly one container, have %d", w.obj, len(pod.Spec.Containers))
		}
		for i, ctr := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			init := i < len(pod.Spec.InitContainers)
			b, ok := c.checkContainer(w, ctr, init, p)
			for _, e := range ctr.Env {
				src := source(e)
				used[src] = true
				if sources[e.Name] == nil {
					sources[e.Name] = map[string][]string{}
				}
				sources[e.Name][src] = append(sources[e.Name][src], fmt.Sprintf("%s/%s", w.obj.Metadata.Name, ctr.Name))
			}
			if !ok {
				continue
			}
			if !init {
				runs = append(runs, run{w, ctr, b, ctr.Env})
				if long {
					c.checkServer(w, ctr, b, serves, p)
				} else if b.name != "reconcile" {
					p.add("%s: a CronJob runs /reconcile, not /%s", w.obj, b.name)
				}
			}
		}
	}

	byName := map[string]workload{}
	for _, d := range c.deployments {
		byName[d.obj.Metadata.Name] = d
		if !selects(d.selector.MatchLabels, d.pod.Metadata.Labels) || len(d.selector.MatchExpressions) > 0 {
			p.add("%s: selector.matchLabels %v must select its own pod labels %v (matchExpressions unsupported here)", d.obj, d.selector.MatchLabels, d.pod.Metadata.Labels)
		}
		for _, other := range c.deployments {
			if other.obj.Metadata.Name != d.obj.Metadata.Name && selects(d.selector.MatchLabels, other.pod.Metadata.Labels) {
				p.add("%s: its selector also selects the pods of %s", d.obj, other.obj)
			}
		}
		visit(d, true)
	}
	for _, cj := range c.cronJobs {
		visit(cj, false)
	}

	// Every variable has one source across all containers: admit, reconcile and close take
	// ADMIT_KEY_PREFIX from the same ConfigMap key, and so on. (Listen addresses and
	// per-binary settings are literals of one Deployment each; a literal in two places is
	// allowed only if the same literal everywhere is what these rules already force.)
	for name, bySrc := range sources {
		if len(bySrc) > 1 {
			p.add("%s comes from different places: %v", name, bySrc)
		}
	}
	// Every ConfigMap and Secret key is used: a key nobody reads is a typo or a leftover.
	for name, cm := range c.configMaps {
		for k := range cm {
			if !used["configmap "+name+"/"+k] {
				p.add("ConfigMap %s: key %s is used by no container", name, k)
			}
		}
	}
	for name, s := range c.secrets {
		for k := range s {
			if !used["secret "+name+"/"+k] {
				p.add("Secret %s: key %s is used by no container", name, k)
			}
		}
	}

	// What the issue asks for: admit and meter Deployments, reconcile and close CronJobs.
	want := map[string]bool{"Deployment /admit": false, "Deployment /meter": false, "CronJob /reconcile run": false, "CronJob /reconcile close": false}
	var reconcileEnv, closeEnv []envVar
	for _, r := range runs {
		key := r.w.obj.Kind + " /" + r.b.name
		if r.b.name == "reconcile" {
			key += " " + r.b.sub
		}
		if _, ok := want[key]; ok {
			want[key] = true
		}
		switch key {
		case "CronJob /reconcile run":
			reconcileEnv = r.env
		case "CronJob /reconcile close":
			closeEnv = r.env
		}
	}
	for k, ok := range want {
		if !ok {
			p.add("no %s", k)
		}
	}
	if !slices.Equal(envKeys(reconcileEnv), envKeys(closeEnv)) {
		p.add("the reconcile and close CronJobs must have the same environment (one binary, one configuration)")
	}

	// admit: 3 replicas by default; meter: no more replicas than partitions.
	partitions, _ := strconv.Atoi(c.configMaps["metergate"]["KAFKA_TOPIC_PARTITIONS"])
	for _, r := range runs {
		switch {
		case r.w.obj.Kind != "Deployment":
		case r.b.name == "admit" && r.w.replicas < 3:
			p.add("%s: %d replicas, want at least 3", r.w.obj, r.w.replicas)
		case r.b.name == "meter" && (partitions < 1 || r.w.replicas > partitions):
			p.add("%s: %d replicas for KAFKA_TOPIC_PARTITIONS %d: meters beyond the partitions sit idle", r.w.obj, r.w.replicas, partitions)
		}
	}

	// Services reach exactly one Deployment, on a port it declares.
	for name, s := range c.services {
		var matched []workload
		for _, d := range c.deployments {
			if selects(s.Spec.Selector, d.pod.Metadata.Labels) {
				matched = append(matched, d)
			}
		}
		if len(matched) != 1 {
			p.add("Service %s: selector %v selects the pods of %d Deployments, want 1", name, s.Spec.Selector, len(matched))
			continue
		}
		if len(s.Spec.Ports) == 0 {
			p.add("Service %s: no ports", name)
		}
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target == nil {
				target = sp.Port
			}
			if portOf(target, matched[0].pod.Spec.Containers...) == 0 {
				p.add("Service %s: targetPort %v is no port of %s", name, target, matched[0].obj)
			}
		}
	}

	// Every Deployment has a PodDisruptionBudget, selecting its pods and leaving some up.
	covered := map[string]bool{}
	for name, b := range c.pdbs {
		var matched []workload
		for _, d := range c.deployments {
			if selects(b.Spec.Selector.MatchLabels, d.pod.Metadata.Labels) {
				matched = append(matched, d)
			}
		}
		if len(matched) != 1 || len(b.Spec.Selector.MatchExpressions) > 0 {
			p.add("PodDisruptionBudget %s: selector %v selects the pods of %d Deployments, want 1", name, b.Spec.Selector.MatchLabels, len(matched))
			continue
		}
		d := matched[0]
		covered[d.obj.Metadata.Name] = true
		maxU, isMax := b.Spec.MaxUnavailable.(int)
		minA, isMin := b.Spec.MinAvailable.(int)
		switch {
		case isMax && b.Spec.MinAvailable == nil:
			if maxU < 1 || maxU >= d.replicas {
				p.add("PodDisruptionBudget %s: maxUnavailable %d of %d replicas: want 1 to replicas-1 (0 blocks every drain)", name, maxU, d.replicas)
			}
		case isMin && b.Spec.MaxUnavailable == nil:
			if minA < 1 || minA >= d.replicas {
				p.add("PodDisruptionBudget %s: minAvailable %d of %d replicas: want 1 to replicas-1", name, minA, d.replicas)
			}
		default:
			p.add("PodDisruptionBudget %s: set one of maxUnavailable or minAvailable, as an integer", name)
		}
	}
	for name := range byName {
		if !covered[name] {
			p.add("Deployment %s: no PodDisruptionBudget", name)
		}
	}
	sort.Strings(*p)
}

// placeholder marks the values of secret.yaml, a template.
const placeholder = "CHANGE-ME"

// fillSecrets replaces the template's placeholders as an operator would, with a different
// value per key (the two tokens must differ).
func (c *cluster) fillSecrets() {
	for _, s := range c.secrets {
		for k, v := range s {
			s[k] = strings.ReplaceAll(v, placeholder, "filled-"+k+"-0123456789abcdef")
		}
	}
}

// checkDir checks the manifests in dir, with the Secret's placeholders filled in.
func checkDir(t *testing.T, dir fs.FS) problems {
	t.Helper()
	c, p, err := load(dir)
	require.NoError(t, err)
	c.fillSecrets()
	c.check(&p)
	return p
}

// secret.yaml is a template: it holds no real credential, and admit refuses to start with
// it as it is, so an unfilled template cannot run with publicly known tokens.
func TestSecretTemplateCannotRun(t *testing.T) {
	c, _, err := load(os.DirFS("k8s"))
	require.NoError(t, err)
	require.NotEmpty(t, c.secrets["metergate"])
	for k, v := range c.secrets["metergate"] {
		require.Contains(t, v, placeholder, "secret.yaml %s: a template holds placeholders only", k)
	}
	var admit *workload
	for i, d := range c.deployments {
		if len(d.pod.Spec.Containers) == 1 && slices.Equal(d.pod.Spec.Containers[0].Command, []string{"/admit"}) {
			admit = &c.deployments[i]
		}
	}
	require.NotNil(t, admit, "no admit Deployment")
	var p problems
	env := c.resolveEnv("admit", admit.pod.Spec.Containers[0], &p)
	require.Empty(t, p)
	_, err = config.Load(&config.Admit{}, "admit", nil, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard)
	require.ErrorContains(t, err, "ADMIT_SERVICE_TOKEN")
	require.ErrorContains(t, err, "ADMIT_ADMIN_TOKEN")
}

// deploy/k8s is complete and agrees with the binaries.
func TestManifests(t *testing.T) {
	p := checkDir(t, os.DirFS("k8s"))
	require.Empty(t, p, "deploy/k8s:\n%s", strings.Join(p, "\n"))
}

// Each check catches the mistake it is for: the manifests, each with one mistake, fail.
func TestManifestChecksCatchMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new, want string
	}{
		{"file not in kustomization", "kustomization.yaml", "  - pdb.yaml\n", "", "does not list pdb.yaml"},
		{"missing file", "kustomization.yaml", "  - pdb.yaml\n", "  - pdb.yaml\n  - hpa.yaml\n", "lists hpa.yaml"},
		{"namespace", "admit.yaml", "  name: metergate-admit\n", "  name: metergate-admit\n  namespace: prod\n", "namespace-agnostic"},
		{"variable the binary does not read", "meter.yaml", "name: METER_GROUP,", "name: METER_GROUPS,", "which meter does not read"},
		{"admit-only variable on meter", "meter.yaml", "- {name: SHUTDOWN_TIMEOUT, value: 15s}", "- {name: SHUTDOWN_TIMEOUT, value: 15s}\n            - {name: ADMIT_SHARDS, valueFrom: {configMapKeyRef: {name: metergate, key: ADMIT_SHARDS}}}", "which meter does not read"},
		{"secret key typo", "admit.yaml", "key: admit-admin-token}", "key: admin-token}", `key "admin-token" is not in Secret`},
		{"secret keys swapped", "admit.yaml", "{name: ADMIT_ADMIN_TOKEN, valueFrom: {secretKeyRef: {name: metergate, key: admit-admin-token}}}", "{name: ADMIT_ADMIN_TOKEN, valueFrom: {secretKeyRef: {name: metergate, key: admit-service-token}}}", "which holds ADMIT_SERVICE_TOKEN"},
		{"owner's URL on a service", "meter.yaml", "- {name: SHUTDOWN_TIMEOUT, value: 15s}", "- {name: SHUTDOWN_TIMEOUT, value: 15s}\n            - {name: DATABASE_MIGRATE_URL, valueFrom: {secretKeyRef: {name: metergate, key: database-migrate-url}}}", "only the migrate init containers hold"},
		{"migrations as the services' role", "admit.yaml", "            - {name: DATABASE_MIGRATE_URL, valueFrom: {secretKeyRef: {name: metergate, key: database-migrate-url}}}\n", "", "migrations would run as the services' role"},
		{"configmap key typo", "meter.yaml", "key: KAFKA_TOPIC}", "key: KAFKA_TOPICS}", `key "KAFKA_TOPICS" is not in ConfigMap`},
		{"wrong configmap", "meter.yaml", "{name: metergate, key: KAFKA_TOPIC}", "{name: metergate-config, key: KAFKA_TOPIC}", "which the manifests do not define"},
		{"literal shard count", "reconcile-cronjob.yaml", "{name: ADMIT_SHARDS, valueFrom: {configMapKeyRef: {name: metergate, key: ADMIT_SHARDS}}}", `{name: ADMIT_SHARDS, value: "32"}`, "ADMIT_SHARDS is a literal"},
		{"shards not set", "close-cronjob.yaml", "                - {name: ADMIT_SHARDS, valueFrom: {configMapKeyRef: {name: metergate, key: ADMIT_SHARDS}}}\n", "", "does not set ADMIT_SHARDS"},
		{"bad value", "configmap.yaml", `ADMIT_SHARDS: "16"`, `ADMIT_SHARDS: "sixteen"`, "refuses this configuration"},
		{"unused configmap key", "configmap.yaml", "  LOG_LEVEL: info\n", "  LOG_LEVEL: info\n  METER_BATCH_SIZE: \"500\"\n", "key METER_BATCH_SIZE is used by no container"},
		{"short token", "secret.yaml", "admit-service-token: CHANGE-ME", "admit-service-token: short", "ADMIT_SERVICE_TOKEN"},
		{"unknown flag", "reconcile-cronjob.yaml", `command: ["/reconcile", "-json"]`, `command: ["/reconcile", "-jsn"]`, "refuses this configuration"},
		{"unknown binary", "meter.yaml", `command: ["/meter"]`, `command: ["/metering"]`, "the image holds"},
		{"no command", "meter.yaml", `          command: ["/meter"]` + "\n", "", "no command"},
		{"other image", "admit.yaml", "          image: metergate:latest\n          command: [\"/admit\"]", "          image: nginx:latest\n          command: [\"/admit\"]", "want metergate[:tag]"},
		{"loopback listener", "admit.yaml", `value: "0.0.0.0:8080"`, `value: "127.0.0.1:8080"`, "listens on loopback only"},
		{"listener not set", "meter.yaml", `            - {name: METER_ADDR, value: "0.0.0.0:8081"}` + "\n", "", "listens on loopback only"},
		{"listener port", "meter.yaml", `value: "0.0.0.0:8081"`, `value: "0.0.0.0:9090"`, "declares no such containerPort"},
		{"readiness path", "admit.yaml", "httpGet: {path: /readyz, port: http}", "httpGet: {path: /ready, port: http}", `readinessProbe on "/ready"`},
		{"liveness on readyz", "meter.yaml", "livenessProbe:\n            httpGet: {path: /healthz, port: metrics}", "livenessProbe:\n            httpGet: {path: /readyz, port: metrics}", `livenessProbe on "/readyz"`},
		{"probe port", "admit.yaml", "httpGet: {path: /healthz, port: http}\n            periodSeconds: 10", "httpGet: {path: /healthz, port: 8081}\n            periodSeconds: 10", "livenessProbe port 8081"},
		{"no readiness", "meter.yaml", "          readinessProbe:\n            httpGet: {path: /readyz, port: metrics}\n            periodSeconds: 10\n            timeoutSeconds: 3\n            failureThreshold: 3\n", "", "no readinessProbe"},
		{"readiness timeout", "admit.yaml", "periodSeconds: 5\n            timeoutSeconds: 3", "periodSeconds: 5\n            timeoutSeconds: 2", "not above /readyz's own"},
		{"grace period", "admit.yaml", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20", "terminationGracePeriodSeconds 20s"},
		{"shutdown timeout", "meter.yaml", "{name: SHUTDOWN_TIMEOUT, value: 15s}", "{name: SHUTDOWN_TIMEOUT, value: 45s}", "killed mid-shutdown"},
		{"scrape port", "meter.yaml", `prometheus.io/port: "8081"`, `prometheus.io/port: "8080"`, "prometheus.io/port"},
		{"no cpu request", "meter.yaml", "requests: {cpu: 250m, memory: 256Mi}", "requests: {memory: 256Mi}", "no cpu request"},
		{"no memory limit", "close-cronjob.yaml", "limits: {memory: 1Gi}", "limits: {}", "no memory limit"},
		{"request above limit", "admit.yaml", "requests: {cpu: 500m, memory: 256Mi}", "requests: {cpu: 500m, memory: 1Gi}", "request ≤ limit"},
		{"root", "admit.yaml", "        runAsNonRoot: true\n        runAsUser: 65532", "        runAsNonRoot: false\n        runAsUser: 65532", "runAsNonRoot is not true"},
		{"root user", "meter.yaml", "runAsUser: 65532", "runAsUser: 0", "runAsUser 0"},
		{"writable root fs", "reconcile-cronjob.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "readOnlyRootFilesystem true"},
		{"init container not migrate", "meter.yaml", `command: ["/reconcile", "migrate"]`, `command: ["/reconcile", "verify"]`, "init container is for"},
		{"pdb selector", "pdb.yaml", "matchLabels: {app.kubernetes.io/name: metergate, app.kubernetes.io/component: meter}", "matchLabels: {app.kubernetes.io/name: metergate, app.kubernetes.io/component: meters}", "selects the pods of 0 Deployments"},
		{"pdb blocks drains", "pdb.yaml", "maxUnavailable: 1", "maxUnavailable: 0", "0 blocks every drain"},
		{"service selector", "admit.yaml", "  selector: {app.kubernetes.io/name: metergate, app.kubernetes.io/component: admit}\n  ports:", "  selector: {app.kubernetes.io/name: metergate}\n  ports:", "selects the pods of 2 Deployments"},
		{"service port", "admit.yaml", "targetPort: http", "targetPort: web", "targetPort web"},
		{"too many meters", "meter.yaml", "replicas: 3", "replicas: 13", "sit idle"},
		{"fewer admits", "admit.yaml", "replicas: 3", "replicas: 1", "want at least 3"},
		{"cronjob overlap", "reconcile-cronjob.yaml", "concurrencyPolicy: Forbid", "concurrencyPolicy: Allow", "concurrencyPolicy Forbid"},
		{"close runs reconcile", "close-cronjob.yaml", `command: ["/reconcile", "close"]`, `command: ["/reconcile"]`, "no CronJob /reconcile close"},
		{"close environment", "close-cronjob.yaml", "                - {name: LOG_LEVEL, valueFrom: {configMapKeyRef: {name: metergate, key: LOG_LEVEL}}}\n", "", "same environment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fstest.MapFS{}
			entries, err := os.ReadDir("k8s")
			require.NoError(t, err)
			for _, e := range entries {
				raw, err := os.ReadFile("k8s/" + e.Name())
				require.NoError(t, err)
				dir[e.Name()] = &fstest.MapFile{Data: raw}
			}
			f := dir[tc.file]
			require.NotNil(t, f, tc.file)
			require.Contains(t, string(f.Data), tc.old, "the mutation no longer applies to %s", tc.file)
			f.Data = []byte(strings.Replace(string(f.Data), tc.old, tc.new, 1))

			p := checkDir(t, dir)
			require.NotEmpty(t, p, "the mistake went unnoticed")
			require.True(t, slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }),
				"want a problem containing %q, got:\n%s", tc.want, strings.Join(p, "\n"))
		})
	}
}
