// Package webhook signs webhook deliveries per the Standard Webhooks specification
// (https://www.standardwebhooks.com: webhook-id, webhook-timestamp, webhook-signature,
// HMAC-SHA256 over "<id>.<timestamp>.<body>") and sends them with an HTTP client that
// refuses private targets, follows no redirect and reads a bounded reply.
//
// It is the delivering side of usage alerts (issue 19) and billing events (issue 31); the
// signing itself is the specification's own Go library
// (github.com/standard-webhooks/standard-webhooks).
package webhook

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The headers of a signed delivery.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every secret, as the specification writes them: "whsec_" and the
// base64 of the key.
const SecretPrefix = "whsec_"

// NewSecret returns a new random secret of 32 bytes, "whsec_<base64>".
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("new webhook secret: %w", err)
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// ErrNoSecret is returned by Sign without a secret.
var ErrNoSecret = errors.New("webhook: no secret to sign with")

// Sign returns the headers of delivery id of body at ts, signed with every secret given:
// while a secret is rotated the old and the new sign side by side, and a receiver holding
// either verifies ("v1,<sig> v1,<sig>"). The id must stay the same on every retry of a
// delivery, so that receivers can drop duplicates.
func Sign(id string, ts time.Time, body []byte, secrets ...string) (http.Header, error) {
	if len(secrets) == 0 {
		return nil, ErrNoSecret
	}
	sigs := make([]string, 0, len(secrets))
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return nil, fmt.Errorf("webhook secret: %w", err)
		}
		sig, err := wh.Sign(id, ts, body)
		if err != nil {
			return nil, fmt.Errorf("sign webhook %s: %w", id, err)
		}
		sigs = append(sigs, sig)
	}
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return h, nil
}

// Verify checks a delivery's headers against body with secret, the timestamp within the
// specification's tolerance (5 minutes): what a receiver does.
func Verify(secret string, body []byte, h http.Header) error {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return fmt.Errorf("webhook secret: %w", err)
	}
	return wh.Verify(body, h)
}
