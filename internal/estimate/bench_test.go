package estimate_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/metergate/metergate/internal/estimate"
)

// prompt4K is a 4 KiB chat body's text: prose, code and numbers, as prompts are.
func prompt4K() string {
	const chunk = "Summarise the quarterly usage report for the platform team. " +
		"func admit(ctx context.Context, r Request) (Decision, error) { return d, nil } " +
		"Totals: 12,345 requests, 6.7M tokens, p99 latency 41 ms. "
	return strings.Repeat(chunk, 4096/len(chunk)+1)[:4096]
}

// BenchmarkEstimate counts a 4 KiB prompt with each method. The first call loads the
// encoding (outside the timer).
func BenchmarkEstimate(b *testing.B) {
	text, err := json.Marshal(prompt4K())
	if err != nil {
		b.Fatal(err)
	}
	body := json.RawMessage(`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":` + string(text) + `}],"max_tokens":256}`)
	for _, m := range []struct{ name, model string }{
		{"cl100k", "gpt-4"}, {"o200k", "gpt-4o"}, {"fallback", "llama-3"},
	} {
		b.Run(m.name, func(b *testing.B) {
			in := estimate.Input{Model: m.model, Request: body}
			if _, err := estimate.Count(in, estimate.Options{}); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := estimate.Count(in, estimate.Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
