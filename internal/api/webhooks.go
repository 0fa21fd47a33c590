package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/webhook"
)

// Webhooks keeps webhook endpoints and their delivery log (webhook.Store).
type Webhooks interface {
	CreateEndpoint(ctx context.Context, r webhook.EndpointRequest) (webhook.Endpoint, string, error)
	UpdateEndpoint(ctx context.Context, id string, r webhook.EndpointRequest) (webhook.Endpoint, error)
	Endpoint(ctx context.Context, id string) (webhook.Endpoint, error)
	Endpoints(ctx context.Context) ([]webhook.Endpoint, error)
	DeleteEndpoint(ctx context.Context, id string) error
	Rotate(ctx context.Context, id string, overlap time.Duration) (webhook.Endpoint, string, error)
	Deliveries(ctx context.Context, endpoint, status string, limit int) ([]webhook.Delivery, error)
	Delivery(ctx context.Context, endpoint string, id int64) (webhook.Delivery, error)
	Replay(ctx context.Context, endpoint string, id int64) (webhook.Delivery, error)
	ReplayRange(ctx context.Context, endpoint string, from, to time.Time) (int64, error)
}

// endpointBody is the body of POST /v1/admin/webhooks and PUT /v1/admin/webhooks/{id}.
type endpointBody struct {
	URL        string   `json:"url"`
	EventTypes []string `json:"event_types"`
	Account    *string  `json:"account"`
	Enabled    *bool    `json:"enabled"`
}

func (b endpointBody) request() (webhook.EndpointRequest, *Error) {
	r := webhook.EndpointRequest{URL: b.URL, EventTypes: b.EventTypes, Enabled: b.Enabled}
	if b.URL == "" {
		return r, badRequest("invalid_url", "url is required: an absolute http or https URL")
	}
	if len(b.EventTypes) == 0 {
		return r, badRequest("invalid_event_types", "event_types must name at least one type (known: %s)", strings.Join(webhook.EventTypes, ", "))
	}
	if b.Account != nil {
		if !policy.ValidID(*b.Account) {
			return r, badRequest("invalid_account", "account must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit")
		}
		r.Account = *b.Account
	}
	return r, nil
}

// endpointWithSecret is an endpoint with its new secret: the reply of a creation and of a
// rotation, the only times a secret is shown.
type endpointWithSecret struct {
	webhook.Endpoint
	Secret string `json:"secret"`
}

// webhookError answers err of the webhook store; op names what failed in the log.
func (s *Server) webhookError(w http.ResponseWriter, op string, err error) {
	var inv *webhook.InvalidError
	switch {
	case errors.As(err, &inv):
		writeError(w, badRequest("invalid_"+inv.Field, "%s", inv.Message))
	case errors.Is(err, webhook.ErrForbiddenTarget):
		writeError(w, badRequest("forbidden_target",
			"%s; addresses that are not globally reachable (private, loopback, link-local, shared, documentation, ...) are refused unless WEBHOOK_ALLOW_PRIVATE is set", err.Error()))
	case errors.Is(err, webhook.ErrUnknownAccount):
		writeError(w, badRequest("unknown_account", "%s: an endpoint's account filter must name an existing account", err.Error()))
	case errors.Is(err, webhook.ErrNotFound):
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error()})
	default:
		if err != nil {
			s.cfg.Log.Error(op, "err", err)
		}
		writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "webhooks are unavailable; retry later"})
	}
}

// webhooks wraps a webhook handler: 503 when no store is configured.
func (s *Server) webhooks(h func(w http.ResponseWriter, r *http.Request, store Webhooks)) http.HandlerFunc {
	return s.admin(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Webhooks == nil {
			s.webhookError(w, "webhooks: no webhook store configured", nil)
			return
		}
		h(w, r, s.cfg.Webhooks)
	})
}

func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, store Webhooks) {
	var b endpointBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	req, e := b.request()
	if e != nil {
		writeError(w, e)
		return
	}
	ep, secret, err := store.CreateEndpoint(r.Context(), req)
	if err != nil {
		s.webhookError(w, "create webhook endpoint", err)
		return
	}
	writeJSON(w, http.StatusCreated, endpointWithSecret{Endpoint: ep, Secret: secret})
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, store Webhooks) {
	eps, err := store.Endpoints(r.Context())
	if err != nil {
		s.webhookError(w, "list webhook endpoints", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string][]webhook.Endpoint{"webhooks": eps})
}

func (s *Server) getWebhook(w http.ResponseWriter, r *http.Request, store Webhooks) {
	ep, err := store.Endpoint(r.Context(), r.PathValue("id"))
	if err != nil {
		s.webhookError(w, "read webhook endpoint", err)
		return
	}
	writeJSON(w, http.StatusOK, ep)
}

func (s *Server) updateWebhook(w http.ResponseWriter, r *http.Request, store Webhooks) {
	var b endpointBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	req, e := b.request()
	if e != nil {
		writeError(w, e)
		return
	}
	ep, err := store.UpdateEndpoint(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.webhookError(w, "update webhook endpoint", err)
		return
	}
	writeJSON(w, http.StatusOK, ep)
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, store Webhooks) {
	if err := store.DeleteEndpoint(r.Context(), r.PathValue("id")); err != nil {
		s.webhookError(w, "delete webhook endpoint", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// rotateBody is the optional body of POST /v1/admin/webhooks/{id}/rotate.
type rotateBody struct {
	OverlapS *int64 `json:"overlap_s"`
}

func (s *Server) rotateWebhook(w http.ResponseWriter, r *http.Request, store Webhooks) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		writeError(w, badRequest("unreadable_body", "could not read the request body"))
		return
	}
	overlap := webhook.DefaultOverlap
	if len(raw) > 0 {
		if len(raw) > MaxBodyBytes {
			writeError(w, bodyTooLarge(MaxBodyBytes))
			return
		}
		var b rotateBody
		if e := decodeRaw(raw, &b); e != nil {
			writeError(w, e)
			return
		}
		if b.OverlapS != nil {
			if *b.OverlapS < 0 || *b.OverlapS > int64(webhook.MaxOverlap/time.Second) {
				writeError(w, badRequest("invalid_overlap", "overlap_s must be 0-%d seconds", int64(webhook.MaxOverlap/time.Second)))
				return
			}
			overlap = time.Duration(*b.OverlapS) * time.Second
		}
	}
	ep, secret, err := store.Rotate(r.Context(), r.PathValue("id"), overlap)
	if err != nil {
		s.webhookError(w, "rotate webhook secret", err)
		return
	}
	writeJSON(w, http.StatusOK, endpointWithSecret{Endpoint: ep, Secret: secret})
}

// defaultDeliveries is how many deliveries a list returns without limit.
const defaultDeliveries = 100

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request, store Webhooks) {
	q := r.URL.Query()
	status := q.Get("status")
	switch status {
	case "", webhook.StatusPending, webhook.StatusDelivered, webhook.StatusFailed:
	default:
		writeError(w, badRequest("invalid_status", "status must be pending, delivered or failed"))
		return
	}
	limit := defaultDeliveries
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > webhook.MaxList {
			writeError(w, badRequest("invalid_limit", "limit must be a whole number, 1-%d", webhook.MaxList))
			return
		}
		limit = n
	}
	ds, err := store.Deliveries(r.Context(), r.PathValue("id"), status, limit)
	if err != nil {
		s.webhookError(w, "list webhook deliveries", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string][]webhook.Delivery{"deliveries": ds})
}

// deliveryID reads the path's {delivery}.
func deliveryID(r *http.Request) (int64, *Error) {
	id, err := strconv.ParseInt(r.PathValue("delivery"), 10, 64)
	if err != nil {
		return 0, badRequest("invalid_delivery", "a delivery id is a whole number")
	}
	return id, nil
}

func (s *Server) getDelivery(w http.ResponseWriter, r *http.Request, store Webhooks) {
	id, e := deliveryID(r)
	if e != nil {
		writeError(w, e)
		return
	}
	d, err := store.Delivery(r.Context(), r.PathValue("id"), id)
	if err != nil {
		s.webhookError(w, "read webhook delivery", err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (s *Server) replayDelivery(w http.ResponseWriter, r *http.Request, store Webhooks) {
	id, e := deliveryID(r)
	if e != nil {
		writeError(w, e)
		return
	}
	d, err := store.Replay(r.Context(), r.PathValue("id"), id)
	if err != nil {
		s.webhookError(w, "replay webhook delivery", err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// replayBody is the body of POST /v1/admin/webhooks/{id}/replay.
type replayBody struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (s *Server) replayWebhooks(w http.ResponseWriter, r *http.Request, store Webhooks) {
	var b replayBody
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	from, err := time.Parse(time.RFC3339Nano, b.From)
	if err != nil {
		writeError(w, badRequest("invalid_from", "from must be an RFC 3339 time, e.g. 2026-11-01T00:00:00Z"))
		return
	}
	to, err := time.Parse(time.RFC3339Nano, b.To)
	if err != nil {
		writeError(w, badRequest("invalid_to", "to must be an RFC 3339 time, e.g. 2026-12-01T00:00:00Z"))
		return
	}
	n, err := store.ReplayRange(r.Context(), r.PathValue("id"), from, to)
	if err != nil {
		s.webhookError(w, "replay webhook deliveries", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"queued": n})
}
