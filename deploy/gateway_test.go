package deploy_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3" // typed configs of the examples
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/policy"
)

// fromYAML decodes YAML into a proto message through its JSON form, refusing unknown
// fields, and validates it with Envoy's rules, the messages packed in Any included.
func fromYAML(t *testing.T, v any, m proto.Message) {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	require.NoError(t, protojson.Unmarshal(raw, m))
	validate(t, m)
}

func validate(t *testing.T, m proto.Message) {
	t.Helper()
	require.NoError(t, m.(interface{ ValidateAll() error }).ValidateAll())
	err := protorange.Range(m.ProtoReflect(), func(v protopath.Values) error {
		last := v.Index(-1)
		if last.Step.Kind() != protopath.AnyExpandStep {
			return nil
		}
		inner := last.Value.Message().Interface()
		return inner.(interface{ ValidateAll() error }).ValidateAll()
	})
	require.NoError(t, err)
}

// yamlDocs reads the YAML documents of a file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var docs []map[string]any
	dec := yaml.NewDecoder(f)
	for {
		var d map[string]any
		if err := dec.Decode(&d); err != nil {
			break
		}
		docs = append(docs, d)
	}
	require.NotEmpty(t, docs, path)
	return docs
}

// requireMappedKeys checks that the descriptor keys of the rate limits are admit's
// default mapping (or ignored by default), that the request path carries the API key and
// nothing the client decides its charge with (tool, idempotency key, hits_addend), and that
// the stream-done rate limits carry the event id, one of them the credits unit.
func requireMappedKeys(t *testing.T, limits []*routev3.RateLimit) {
	t.Helper()
	m := api.DefaultRLS
	mapped := []string{m.APIKey, m.Account, m.Tool, m.IdempotencyKey, m.Event, m.Status, m.Unit}
	var keys, doneKeys []string
	hits := false
	for _, l := range limits {
		for _, a := range l.GetActions() {
			var key string
			switch {
			case a.GetGenericKey() != nil:
				key = a.GetGenericKey().GetDescriptorKey()
				if key == "" {
					key = "generic_key" // Envoy's default key
				}
				if key == m.Unit {
					require.True(t, policy.Unit(a.GetGenericKey().GetDescriptorValue()).Valid(), "%v", a)
				}
			case a.GetRequestHeaders() != nil:
				key = a.GetRequestHeaders().GetDescriptorKey()
			case a.GetHeaderValueMatch() != nil:
				key = a.GetHeaderValueMatch().GetDescriptorKey()
				if key == "" {
					key = "header_match"
				}
			default:
				t.Fatalf("an action admit's tests do not know: %v", a)
			}
			require.True(t, slices.Contains(mapped, key) || slices.Contains(m.Ignore, key),
				"descriptor key %q is neither mapped nor ignored by admit's defaults", key)
			if l.GetApplyOnStreamDone() {
				doneKeys = append(doneKeys, key)
			} else {
				keys = append(keys, key)
			}
		}
		if !l.GetApplyOnStreamDone() && l.GetHitsAddend().GetFormat() != "" {
			hits = true
		}
	}
	require.Contains(t, keys, m.APIKey)
	require.NotContains(t, keys, m.Tool, "the client's x-tool decides no charge")
	require.NotContains(t, keys, m.IdempotencyKey, "the client's idempotency key passes nothing twice")
	require.NotContains(t, keys, m.Event, "the request path names no event: that call would be an outcome")
	require.False(t, hits, "the client's estimated tokens are no hits_addend")
	require.Contains(t, doneKeys, m.Event, "the stream-done call names the admitted event")
	require.Contains(t, doneKeys, m.Unit, "the stream-done call settles credits too")
}

// deploy/envoy/envoy.yaml is a valid Envoy bootstrap whose rate-limit filter asks admit's
// gRPC port (the cluster exists, HTTP/2, health-checked on the rate-limit service) with
// descriptors admit's default mapping reads.
func TestEnvoyExample(t *testing.T) {
	t.Parallel()
	docs := yamlDocs(t, "envoy/envoy.yaml")
	var bs bootstrapv3.Bootstrap
	fromYAML(t, docs[0], &bs)

	clusters := map[string]bool{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
		if c.GetName() != "metergate_admit" {
			continue
		}
		require.Contains(t, c.GetTypedExtensionProtocolOptions(), "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", "gRPC needs HTTP/2")
		require.Equal(t, api.RLSService, c.GetHealthChecks()[0].GetGrpcHealthCheck().GetServiceName())
		addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		require.Equal(t, uint32(8090), addr.GetPortValue())
	}
	require.True(t, clusters["metergate_admit"])

	hcm := &hcmv3.HttpConnectionManager{}
	require.NoError(t, bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm))
	var names []string
	var rl *ratelimitv3.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		if f.GetName() == "envoy.filters.http.ratelimit" {
			rl = &ratelimitv3.RateLimit{}
			require.NoError(t, f.GetTypedConfig().UnmarshalTo(rl))
		}
	}
	require.Equal(t, []string{"envoy.filters.http.header_mutation", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}, names,
		"a client's x-metergate-event-id is removed before the rate-limit filter")
	require.NotNil(t, rl)
	requireFilter(t, rl, "metergate_admit")

	var limits []*routev3.RateLimit
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			per := &ratelimitv3.RateLimitPerRoute{}
			require.NoError(t, r.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(per))
			limits = append(limits, per.GetRateLimits()...)
		}
	}
	requireMappedKeys(t, limits)

	// admit's refusals keep their status: 402, 401, 403 and 503 from the dynamic metadata.
	var mapped []uint32
	for _, m := range hcm.GetLocalReplyConfig().GetMappers() {
		require.Equal(t, "envoy.filters.http.ratelimit", m.GetFilter().GetMetadataFilter().GetMatcher().GetFilter())
		mapped = append(mapped, m.GetStatusCode().GetValue())
	}
	require.ElementsMatch(t, []uint32{402, 401, 403, 503}, mapped)
}

// requireFilter checks the rate-limit filter: admit's domain-agnostic service on cluster,
// v3, failing closed on errors, with the service token as gRPC metadata.
func requireFilter(t *testing.T, rl *ratelimitv3.RateLimit, cluster string) {
	t.Helper()
	require.NotEmpty(t, rl.GetDomain())
	require.True(t, rl.GetFailureModeDeny(), "a call admit could not answer refuses")
	svc := rl.GetRateLimitService().GetGrpcService()
	require.Equal(t, cluster, svc.GetEnvoyGrpc().GetClusterName())
	require.Len(t, svc.GetInitialMetadata(), 1)
	require.Equal(t, "authorization", svc.GetInitialMetadata()[0].GetKey())
	require.True(t, strings.HasPrefix(svc.GetInitialMetadata()[0].GetValue(), "Bearer "))
}

// deploy/istio: the EnvoyFilters' Envoy configuration is valid, the rate-limit filter's
// cluster is the one Istio makes of the Service admit-grpc.yaml declares, whose port is
// the one the Deployment patch opens and sets ADMIT_GRPC_ADDR to, and the descriptors are
// admit's default mapping.
func TestIstioExample(t *testing.T) {
	t.Parallel()
	kust := yamlDocs(t, "istio/kustomization.yaml")[0]
	require.ElementsMatch(t, []any{"../k8s", "admit-grpc.yaml", "ratelimit.yaml"}, kust["resources"])

	svc := yamlDocs(t, "istio/admit-grpc.yaml")[0]
	name := svc["metadata"].(map[string]any)["name"].(string)
	port := svc["spec"].(map[string]any)["ports"].([]any)[0].(map[string]any)
	require.Equal(t, "grpc", port["targetPort"])
	require.Equal(t, "grpc", port["appProtocol"])
	cluster := "outbound|" + itoa(port["port"]) + "||" + name + ".metergate.svc.cluster.local"

	patch := yamlDocs(t, "istio/admit-grpc-patch.yaml")[0]
	ctr := patch["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	require.Equal(t, "admit", ctr["name"])
	require.Equal(t, map[string]any{"name": "grpc", "containerPort": port["port"], "protocol": "TCP"}, ctr["ports"].([]any)[0])
	env := ctr["env"].([]any)[0].(map[string]any)
	require.Equal(t, "ADMIT_GRPC_ADDR", env["name"])
	require.Equal(t, "0.0.0.0:"+itoa(port["port"]), env["value"])
	requireAdmitSetting(t, "ADMIT_GRPC_ADDR")

	var filters []string
	var limits []*routev3.RateLimit
	for _, doc := range yamlDocs(t, "istio/ratelimit.yaml") {
		require.Equal(t, "EnvoyFilter", doc["kind"])
		for _, p := range doc["spec"].(map[string]any)["configPatches"].([]any) {
			p := p.(map[string]any)
			value := p["patch"].(map[string]any)["value"]
			switch p["applyTo"] {
			case "HTTP_FILTER":
				var f hcmv3.HttpFilter
				fromYAML(t, value, &f)
				filters = append(filters, f.GetName())
				if f.GetName() == "envoy.filters.http.ratelimit" {
					rl := &ratelimitv3.RateLimit{}
					require.NoError(t, f.GetTypedConfig().UnmarshalTo(rl))
					requireFilter(t, rl, cluster)
				}
			case "VIRTUAL_HOST":
				// A MERGE patch: a partial virtual host, whose parts are validated.
				raw, err := json.Marshal(value)
				require.NoError(t, err)
				var vh routev3.VirtualHost
				require.NoError(t, protojson.Unmarshal(raw, &vh))
				per := &ratelimitv3.RateLimitPerRoute{}
				require.NoError(t, vh.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(per))
				validate(t, per)
				limits = append(limits, per.GetRateLimits()...)
			default:
				t.Fatalf("a patch admit's tests do not know: %v", p["applyTo"])
			}
		}
	}
	require.ElementsMatch(t, []string{"envoy.filters.http.ratelimit", "envoy.filters.http.header_mutation"}, filters)
	requireMappedKeys(t, limits)
}

func itoa(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// requireAdmitSetting checks that admit reads the variable.
func requireAdmitSetting(t *testing.T, name string) {
	t.Helper()
	l := config.NewLoader("admit", func(string) (string, bool) { return "", false }, nil)
	(&config.Admit{}).Register(l)
	require.Contains(t, l.Names(), name)
}
