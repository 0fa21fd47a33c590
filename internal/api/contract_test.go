package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/api/apitest"
)

// newContractServer serves h like httptest.NewServer, closed when t ends, and checks every
// request and reply through it against the OpenAPI document (apitest.Handler): a reply the
// document does not describe, or a request the API and the document judge differently,
// fails t. setup builds every API test's server with it.
func newContractServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(apitest.Handler(t, h))
	t.Cleanup(srv.Close)
	return srv
}

// servedDocument is the document as admit serves it.
func servedDocument(t *testing.T) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	api.New(api.Config{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.Bytes()
}

// exchange builds a checked exchange from a request line, a request body and a reply.
func exchange(method, target, token, body string, status int, header http.Header, reply string) apitest.Exchange {
	r := httptest.NewRequest(method, target, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if header == nil {
		header = http.Header{}
	}
	if header.Get("Content-Type") == "" && reply != "" {
		header.Set("Content-Type", "application/json")
	}
	return apitest.Exchange{Request: r, RequestBody: []byte(body), Status: status, Header: header, Body: []byte(reply)}
}

const (
	storedAccount = `{"id":"acme","kind":"org","parent":"","org":"acme","plan":"pro",` +
		`"limits":{"tokens":{"algorithm":"token_bucket","rate_per_s":277.7,"burst":1000000,"limit":1000000,"window_s":3600}},` +
		`"created_at":"2026-05-01T10:00:00.123456Z","updated_at":"2026-05-01T10:00:00.123456Z",` +
		`"effective":{"org":"acme","plan":"pro","priority":0,"path":[{"account":"acme","kind":"org","plan":"pro","concurrency":0,` +
		`"limits":{"requests":{"algorithm":"token_bucket","rate_per_s":100,"burst":300,"quota":5000000,"quota_period":"month"}}}]}}` + "\n"
	eventID = "0196a0c4-7b1e-7c3a-9f00-0123456789ab.3.acme"
)

// The checker passes exchanges the document describes and fails every kind of drift: a
// reply field, status, header or content type the document does not have, and a request
// the API and the document judge differently. (What the API tests see is checked by
// setup's server; this is the proof that the checker can fail.)
func TestContractCatchesDrift(t *testing.T) {
	t.Parallel()
	c, err := apitest.Load(servedDocument(t))
	require.NoError(t, err)
	tooMany := http.Header{"Retry-After": {"2"}, "Ratelimit-Policy": {`"acme-requests";q=300;w=3, "acme-requests-quota";q=5000000;w=2678400`},
		"Ratelimit": {`"acme-requests";r=0;t=1, "acme-requests-quota";r=4999000;t=86400`}}
	valid := []struct {
		name string
		ex   apitest.Exchange
	}{
		{"account reply", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil, storedAccount)},
		{"allowed", exchange("POST", "/v1/admit", "svc", `{"account":"acme","units":{"tokens":10}}`, 200, nil,
			`{"decision":"allow","event_id":"`+eventID+`","account":"acme","org":"acme","period":"2026-05"}`)},
		{"rate limited", exchange("POST", "/v1/admit", "svc", `{"api_key":"mgk_x"}`, 429, tooMany,
			`{"decision":"rate_limited","account":"acme","org":"acme","blocked_by":{"account":"acme","level":"org","unit":"requests"},"retry_after_ms":1200}`)},
		{"outcome", exchange("POST", "/v1/outcomes", "svc", `{"event_id":"`+eventID+`","status":200}`, 202, nil,
			`{"status":"accepted","event_id":"`+eventID+`"}`)},
		{"unknown path", exchange("POST", "/v2/admit", "svc", "", 404, nil, `{"error":{"code":"not_found","message":"no such route: /v2/admit"}}`)},
		{"wrong method", exchange("GET", "/v1/admit", "svc", "", 405, http.Header{"Allow": {"POST"}},
			`{"error":{"code":"method_not_allowed","message":"GET is not allowed"}}`)},
		{"inexpressible 400", exchange("PUT", "/v1/admin/accounts/acme", "adm", `{"id":"other"}`, 400, nil,
			`{"error":{"code":"invalid_id","message":"the body's id \"other\" differs from the path's \"acme\""}}`)},
		{"401 judges no request", exchange("POST", "/v1/admit", "", `{"nonsense":true}`, 401, nil,
			`{"error":{"code":"unauthorized","message":"a valid service token is required"}}`)},
	}
	for _, tt := range valid {
		require.NoError(t, c.Check(tt.ex), tt.name)
	}

	drifts := []struct {
		name string
		ex   apitest.Exchange
		want string // in the error
	}{
		{"field the document lacks", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil,
			strings.Replace(storedAccount, `"plan":"pro",`, `"plan":"pro","tier":"gold",`, 1)), `"tier"`},
		{"required field missing", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil,
			strings.Replace(storedAccount, `"org":"acme",`, ``, 1)), `"org"`},
		{"not a date-time", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil,
			strings.Replace(storedAccount, `"created_at":"2026-05-01T10:00:00.123456Z"`, `"created_at":"yesterday"`, 1)), "created_at"},
		{"status the document lacks", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 418, nil,
			`{"error":{"code":"teapot","message":"short and stout"}}`), "status is not supported"},
		{"error code the document lacks", exchange("POST", "/v1/admit", "svc", `{"api_key":"x","x":1}`, 400, nil,
			`{"error":{"code":"bad","message":"bad"}}`), "code"},
		{"wrong content type", exchange("GET", "/openapi.yaml", "", "", 200, http.Header{"Content-Type": {"application/json"}},
			`"openapi: 3.0.3"`), "Content-Type"},
		{"Retry-After missing on 503", exchange("POST", "/v1/admit", "svc", `{"account":"acme"}`, 503, nil,
			`{"error":{"code":"unavailable","message":"retry later"}}`), "Retry-After"},
		{"bad RateLimit field", exchange("POST", "/v1/admit", "svc", `{"account":"acme"}`, 200, http.Header{"Ratelimit": {"12"}},
			`{"decision":"allow","event_id":"`+eventID+`","account":"acme","org":"acme","period":"2026-05"}`), "RateLimit"},
		{"405 without Allow", exchange("GET", "/v1/admit", "svc", "", 405, nil,
			`{"error":{"code":"method_not_allowed","message":"GET is not allowed"}}`), "Allow"},
		{"unknown path answered 200", exchange("GET", "/v1/nothing", "svc", "", 200, nil, `{}`), "status is not supported"},
		{"400 for a request the document accepts", exchange("POST", "/v1/admit", "svc", `{"account":"acme"}`, 400, nil,
			`{"error":{"code":"invalid_account","message":"account must be ..."}}`), "a request the document accepts"},
		{"200 for a request the document refuses", exchange("POST", "/v1/admit", "svc", `{"account":"acme","units":{"gpus":1}}`, 200, nil,
			`{"decision":"allow","event_id":"`+eventID+`","account":"acme","org":"acme","period":"2026-05"}`), "a request the document refuses"},
		{"200 without a token", exchange("POST", "/v1/admit", "", `{"account":"acme"}`, 200, nil,
			`{"decision":"allow","event_id":"`+eventID+`","account":"acme","org":"acme","period":"2026-05"}`), "a request the document refuses"},
	}
	for _, tt := range drifts {
		err := c.Check(tt.ex)
		require.Error(t, err, tt.name)
		require.Contains(t, err.Error(), tt.want, tt.name)
		t.Logf("%s: %v", tt.name, err)
	}
}

// A document without created_at in the account reply fails the account reply the API
// sends: what happens to the API tests when the document drifts from a handler.
func TestContractFailsWhenTheDocumentDrifts(t *testing.T) {
	t.Parallel()
	doc := string(servedDocument(t))
	const line = "        created_at: {type: string, format: date-time}\n"
	i := strings.Index(doc, "    AccountReply:\n")
	require.Positive(t, i)
	j := strings.Index(doc[i:], line)
	require.Positive(t, j)
	broken, err := apitest.Load([]byte(doc[:i+j] + doc[i+j+len(line):]))
	require.NoError(t, err)
	err = broken.Check(exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil, storedAccount))
	require.ErrorContains(t, err, `property "created_at" is unsupported`)
}

// Every exception of apitest.Inexpressible names a 400 code the document lists, and every
// path served beside the API that the checker skips is one the document does not have.
func TestContractExceptionsAreTheDocuments(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData(servedDocument(t))
	require.NoError(t, err)
	codes := doc.Components.Schemas["BadRequestError"].Value.Properties["error"].Value.Properties["code"].Value.Enum
	for _, e := range apitest.Inexpressible {
		require.Contains(t, codes, e.Code, "apitest.Inexpressible lists %q, which is not a 400 code of the document", e.Code)
		require.NotEmpty(t, e.Why, e.Code)
	}
	var raw struct {
		Paths map[string]any `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(servedDocument(t), &raw))
	for p := range apitest.Unchecked {
		require.NotContains(t, raw.Paths, p)
	}
}

// What the check adds to every exchange of the API tests.
func BenchmarkContractCheck(b *testing.B) {
	rec := httptest.NewRecorder()
	api.New(api.Config{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	c, err := apitest.Load(rec.Body.Bytes())
	require.NoError(b, err)
	for _, bm := range []struct {
		name string
		ex   apitest.Exchange
	}{
		{"admit", exchange("POST", "/v1/admit", "svc", `{"api_key":"mgk_x","units":{"tokens":20000}}`, 200,
			http.Header{"Ratelimit-Policy": {`"acme-requests";q=300;w=3`}, "Ratelimit": {`"acme-requests";r=12;t=1`}},
			`{"decision":"allow","event_id":"`+eventID+`","account":"acme","org":"acme","period":"2026-05"}`)},
		{"account", exchange("GET", "/v1/admin/accounts/acme", "adm", "", 200, nil, storedAccount)},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Check(bm.ex); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
