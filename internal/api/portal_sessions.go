package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/metergate/metergate/internal/customer"
)

// PortalSessions makes one-time links to portal sessions (customer.Store;
// docs/portal.md#portal-sessions).
type PortalSessions interface {
	CreateSession(ctx context.Context, account string, scopes []customer.Scope, returnURL, by string) (customer.Session, string, error)
}

// portalSession is the reply of POST /v1/admin/portal-sessions: the session and its link,
// whose code is shown this once (the audit log keeps the link redacted).
type portalSession struct {
	customer.Session
	URL string `json:"url"`
}

// createPortalSession makes a link to a portal session for a customer: the operator's
// backend sends the customer to its url, which opens once within customer.LinkTTL.
func (s *Server) createPortalSession(w http.ResponseWriter, r *http.Request, store Customers) {
	sessions, ok := store.(PortalSessions)
	if !ok {
		s.customerError(w, "portal sessions: no store configured", nil)
		return
	}
	var b struct {
		Account   string           `json:"account"`
		Scopes    []customer.Scope `json:"scopes"`
		ReturnURL string           `json:"return_url"`
	}
	if e := decodeJSON(r.Body, &b); e != nil {
		writeError(w, e)
		return
	}
	who, e := s.staffOf(r)
	if e != nil {
		writeError(w, e)
		return
	}
	sess, code, err := sessions.CreateSession(r.Context(), b.Account, b.Scopes, b.ReturnURL, who.ID)
	if err != nil {
		s.customerError(w, "make a portal session", err)
		return
	}
	writeJSON(w, http.StatusCreated, portalSession{Session: sess, URL: portalLink(s.cfg.PortalURL, code)})
}

// portalLink is the link of a portal session's code: below base (PORTAL_PUBLIC_URL), or a
// path of this host when base is empty.
func portalLink(base, code string) string {
	return strings.TrimSuffix(base, "/") + "/portal/session/" + code
}
