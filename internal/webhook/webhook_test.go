package webhook_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/webhook"
)

// A delivery signed with a secret verifies with it (the specification's own verifier) and
// not with another; the body cannot change under the signature.
func TestSignVerifies(t *testing.T) {
	t.Parallel()
	secret, err := webhook.NewSecret()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(secret, webhook.SecretPrefix))
	other, err := webhook.NewSecret()
	require.NoError(t, err)
	body := []byte(`{"type":"io.metergate.usage.threshold.v1"}`)
	h, err := webhook.Sign("msg_1", time.Now(), body, secret)
	require.NoError(t, err)
	require.Equal(t, "msg_1", h.Get(webhook.HeaderID))
	require.Regexp(t, `^v1,[A-Za-z0-9+/=]+$`, h.Get(webhook.HeaderSignature))
	require.NoError(t, webhook.Verify(secret, body, h))
	require.Error(t, webhook.Verify(other, body, h), "another secret")
	require.Error(t, webhook.Verify(secret, []byte(`{"type":"x"}`), h), "another body")
	old, err := webhook.Sign("msg_1", time.Now().Add(-time.Hour), body, secret)
	require.NoError(t, err)
	require.Error(t, webhook.Verify(secret, body, old), "a timestamp outside the tolerance")
	_, err = webhook.Sign("msg_1", time.Now(), body)
	require.ErrorIs(t, err, webhook.ErrNoSecret)
}

// While a secret is rotated, deliveries carry both signatures: a receiver holding the old
// secret and one holding the new both verify.
func TestRotationOverlap(t *testing.T) {
	t.Parallel()
	oldSecret, _ := webhook.NewSecret()
	newSecret, _ := webhook.NewSecret()
	body := []byte(`{}`)
	h, err := webhook.Sign("msg_2", time.Now(), body, oldSecret, newSecret)
	require.NoError(t, err)
	require.Len(t, strings.Fields(h.Get(webhook.HeaderSignature)), 2)
	require.NoError(t, webhook.Verify(oldSecret, body, h))
	require.NoError(t, webhook.Verify(newSecret, body, h))
}

// The client refuses loopback targets by default, with a clear error, and reaches them
// when allowed; it follows no redirect and reads a bounded reply.
func TestClientGuardsTargets(t *testing.T) {
	t.Parallel()
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		got, _ = io.ReadAll(r.Body)
		_, _ = w.Write([]byte(strings.Repeat("x", 10_000)))
	}))
	t.Cleanup(srv.Close)
	secret, _ := webhook.NewSecret()
	body := []byte(`{"a":1}`)
	h, err := webhook.Sign("msg_3", time.Now(), body, secret)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)

	_, err = webhook.NewClient(webhook.Options{}).Post(ctx, srv.URL, h, body)
	require.ErrorIs(t, err, webhook.ErrForbiddenTarget)
	require.Contains(t, err.Error(), "127.0.0.1 is not a public address")
	require.Nil(t, got, "nothing reached the receiver")

	c := webhook.NewClient(webhook.Options{AllowPrivate: true, MaxReply: 100})
	r, err := c.Post(ctx, srv.URL, h, body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.Status)
	require.Len(t, r.Body, 100, "the reply read up to the bound")
	require.Equal(t, body, got)

	r, err = c.Post(ctx, srv.URL+"/redirect", h, body)
	require.NoError(t, err)
	require.Equal(t, http.StatusFound, r.Status, "not followed")
}

// Every kind of address that is not public is refused.
func TestForbiddenAddresses(t *testing.T) {
	t.Parallel()
	c := webhook.NewClient(webhook.Options{Timeout: 2 * time.Second})
	for _, host := range []string{"127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "[::1]", "[fe80::1]", "[fd00::1]", "0.0.0.0"} {
		_, err := c.Post(context.Background(), "http://"+host+":9/hook", http.Header{}, []byte(`{}`))
		require.True(t, errors.Is(err, webhook.ErrForbiddenTarget), "%s: %v", host, err)
	}
}
