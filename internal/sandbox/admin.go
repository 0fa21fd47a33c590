package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Admin calls admit's admin API.
type Admin struct {
	Base, Token string // admit's base URL and admin token
	HTTP        *http.Client
}

// Do sends body as JSON and decodes the reply into out (unless nil); an answer other than
// want is an error carrying the reply.
func (a Admin) Do(ctx context.Context, method, path string, body any, want int, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, method, a.Base+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decode reply: %w", method, path, err)
		}
	}
	return nil
}

// WaitLoaded returns once admit's policy cache holds every write made before it: it
// writes update (the account's own fields, so nothing changes) to account id until the
// reply carries "effective", which a write's reply does when a cache load that began after
// it is done; a load sees every write committed before it, API keys included.
func (a Admin) WaitLoaded(ctx context.Context, id string, update any) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var reply struct {
			Effective json.RawMessage `json:"effective"`
		}
		if err := a.Do(ctx, http.MethodPut, "/v1/admin/accounts/"+id, update, http.StatusOK, &reply); err != nil {
			return err
		}
		if len(reply.Effective) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("admit's policy cache did not load the accounts within 30 s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
