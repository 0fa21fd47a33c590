package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bodyFile := filepath.Join(dir, "body.json")
	itemsFile := filepath.Join(dir, "items.txt")
	require.NoError(t, os.WriteFile(bodyFile, []byte(`{"account":"{{item}}","units":{"requests":1}}`+"\n"), 0o600))
	require.NoError(t, os.WriteFile(itemsFile, []byte("acme\n\n globex \n"), 0o600))

	cfg, err := parse([]string{"-url", "http://127.0.0.1:1/v1/admit", "-token", "svc",
		"-body", "@" + bodyFile, "-items", itemsFile, "-idempotency", "-rate", "500", "-duration", "3s"})
	require.NoError(t, err)
	require.Equal(t, 64, cfg.Concurrency)
	require.Equal(t, 500.0, cfg.Rate)

	var body map[string]any
	require.NoError(t, json.Unmarshal(cfg.Body.Render(nil, 1), &body))
	require.Equal(t, "globex", body["account"])
	require.NotEmpty(t, body["idempotency_key"])
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"no items for {{item}}": {"-body", `{"account":"{{item}}"}`},
		"missing body file":     {"-body", "@/nonexistent/body.json"},
		"bad concurrency":       {"-concurrency", "0"},
		"stray argument":        {"extra"},
	} {
		_, err := parse(args)
		require.Error(t, err, name)
	}
}
