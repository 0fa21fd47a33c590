package estimate_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tiktoken-go/tokenizer"

	"github.com/metergate/metergate/internal/estimate"
)

func count(t *testing.T, model string, body string) estimate.Estimate {
	t.Helper()
	e, err := estimate.Count(estimate.Input{Model: model, Request: json.RawMessage(body)}, estimate.Options{})
	require.NoError(t, err)
	require.Equal(t, e.Input+e.Output, e.Total)
	require.Equal(t, e.Breakdown.Text+e.Breakdown.Overhead+e.Breakdown.Images, e.Input)
	return e
}

// Counts published with tiktoken (its README and OpenAI's cookbook "How to count tokens
// with tiktoken"), not taken from the tokenizer under test: they pin the vocabularies.
func TestEncodingsMatchPublishedCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		enc  tokenizer.Encoding
		text string
		want int
	}{
		{tokenizer.Cl100kBase, "hello world", 2},
		{tokenizer.Cl100kBase, "tiktoken is great!", 6},
		{tokenizer.Cl100kBase, "antidisestablishmentarianism", 6},
		{tokenizer.Cl100kBase, "2 + 2 = 4", 7},
		{tokenizer.Cl100kBase, "お誕生日おめでとう", 9},
		{tokenizer.O200kBase, "hello world", 2},
		{tokenizer.O200kBase, "antidisestablishmentarianism", 6},
		{tokenizer.O200kBase, "2 + 2 = 4", 7},
		{tokenizer.O200kBase, "お誕生日おめでとう", 8},
	} {
		c, err := tokenizer.Get(tc.enc)
		require.NoError(t, err)
		n, err := c.Count(tc.text)
		require.NoError(t, err)
		require.Equal(t, tc.want, n, "%s %q", tc.enc, tc.text)
	}
}

func TestMethodFor(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"gpt-4o": estimate.MethodO200k, "gpt-4o-mini": estimate.MethodO200k, "gpt-4.1-nano": estimate.MethodO200k,
		"o1": estimate.MethodO200k, "o3-mini": estimate.MethodO200k, "o4-mini": estimate.MethodO200k,
		"chatgpt-4o-latest": estimate.MethodO200k, "ft:gpt-4o-mini:acme::x": estimate.MethodO200k,
		"gpt-4": estimate.MethodCl100k, "gpt-4-turbo": estimate.MethodCl100k, "gpt-3.5-turbo": estimate.MethodCl100k,
		"claude-sonnet-4-5": estimate.MethodFallback, "llama-3": estimate.MethodFallback, "o10": estimate.MethodFallback,
	} {
		require.Equal(t, want, estimate.MethodFor(model), model)
	}
}

// One user message "hello world" to gpt-4: role "user" (1 token) + "hello world" (2), 3
// per message and 3 for the reply's priming: 9, as the cookbook's counter gives.
func TestOpenAIMessageOverheads(t *testing.T) {
	t.Parallel()
	one := count(t, "gpt-4", `{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10}`)
	require.Equal(t, estimate.MethodCl100k, one.Method)
	require.Equal(t, estimate.Breakdown{Text: 3, Overhead: 6}, one.Breakdown)
	require.Equal(t, int64(9), one.Input)
	require.Equal(t, int64(10), one.Output)
	require.Equal(t, "max_tokens", one.OutputFrom)

	// Each further message adds its text and 3; the reply's priming is counted once.
	two := count(t, "gpt-4", `{"messages":[{"role":"user","content":"hello world"},{"role":"user","content":"hello world"}],"max_tokens":10}`)
	require.Equal(t, one.Input+3+3, two.Input)
	require.Equal(t, one.Breakdown.Overhead+3, two.Breakdown.Overhead)

	// A name costs 1 beyond its text ("bob" is 1 token).
	named := count(t, "gpt-4", `{"messages":[{"role":"user","name":"bob","content":"hello world"}],"max_tokens":10}`)
	require.Equal(t, one.Input+1+1, named.Input)

	// Parts are counted as the string would be.
	parts := count(t, "gpt-4", `{"messages":[{"role":"user","content":[{"type":"text","text":"hello world"}]}],"max_tokens":10}`)
	require.Equal(t, one.Input, parts.Input)
}

func TestOpenAIOutput(t *testing.T) {
	t.Parallel()
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	e := count(t, "gpt-4o", `{`+msgs+`,"max_completion_tokens":300,"max_tokens":200}`)
	require.Equal(t, int64(300), e.Output)
	require.Equal(t, "max_completion_tokens", e.OutputFrom)
	e = count(t, "gpt-4o", `{`+msgs+`}`)
	require.Equal(t, int64(estimate.DefaultOutput), e.Output)
	require.Equal(t, "default", e.OutputFrom)
	e, err := estimate.Count(estimate.Input{Model: "gpt-4o", Request: json.RawMessage(`{` + msgs + `}`)}, estimate.Options{DefaultOutput: 77})
	require.NoError(t, err)
	require.Equal(t, int64(77), e.Output)
}

// The fallback is ceil(characters / 3.5) over all text (roles included), characters being
// runes.
func TestFallback(t *testing.T) {
	t.Parallel()
	// 10 "é" are 10 characters → ceil(10/3.5) = 3; Anthropic's roles are not text and it
	// documents no message overhead.
	e := count(t, "claude-sonnet-4-5", `{"max_tokens":5,"messages":[{"role":"user","content":"éééééééééé"}]}`)
	require.Equal(t, estimate.Anthropic, e.Provider)
	require.Equal(t, estimate.MethodFallback, e.Method)
	require.Equal(t, estimate.Breakdown{Text: 3}, e.Breakdown)
	require.Equal(t, int64(8), e.Total)

	// 15 characters → ceil(15/3.5) = ceil(4.29) = 5; system text counts.
	e = count(t, "claude-x", `{"max_tokens":0,"system":"abcde","messages":[{"role":"user","content":[{"type":"text","text":"0123456789"}]}]}`)
	require.Equal(t, int64(5), e.Breakdown.Text)

	// An OpenAI-shaped body for an unknown model: fallback text (role included) plus overheads.
	e = count(t, "mistral-large", `{"messages":[{"role":"user","content":"abc"}],"max_tokens":1}`)
	require.Equal(t, estimate.OpenAI, e.Provider)
	require.Equal(t, estimate.Breakdown{Text: 2, Overhead: 6}, e.Breakdown) // 7 chars → 2
}

func pngDataURL(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}

func jpegBase64(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, jpeg.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h)), nil))
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

func TestImageFormulas(t *testing.T) {
	t.Parallel()
	// OpenAI's own examples: 1024² high → 768² → 4 tiles → 765; 2048×4096 → 1024×2048 →
	// 768×1536 → 6 tiles → 1105; low is 85 whatever the size.
	require.Equal(t, int64(765), estimate.OpenAIImageTokens(1024, 1024, "high"))
	require.Equal(t, int64(1105), estimate.OpenAIImageTokens(2048, 4096, "high"))
	require.Equal(t, int64(1105), estimate.OpenAIImageTokens(4096, 2048, "auto"))
	require.Equal(t, int64(85), estimate.OpenAIImageTokens(4096, 8192, "low"))
	require.Equal(t, int64(85+170), estimate.OpenAIImageTokens(512, 512, "high"))
	require.Equal(t, int64(85+170*2), estimate.OpenAIImageTokens(513, 100, "high"))
	// Anthropic's: w×h/750, 1000² → 1334, 200² → 54, capped at 1600 after the 1568 px fit.
	require.Equal(t, int64(1334), estimate.AnthropicImageTokens(1000, 1000))
	require.Equal(t, int64(54), estimate.AnthropicImageTokens(200, 200))
	require.Equal(t, int64(1600), estimate.AnthropicImageTokens(5000, 5000))
}

func TestImagesInBodies(t *testing.T) {
	t.Parallel()
	text := count(t, "gpt-4o", `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"}]}]}`)
	withImages := func(parts ...string) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` + strings.Join(parts, ",") + `]}]}`
	}
	img := func(url, detail string) string {
		return fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q,"detail":%q}}`, url, detail)
	}
	e := count(t, "gpt-4o", withImages(img(pngDataURL(t, 1024, 1024), "high"), img(pngDataURL(t, 100, 100), "low"),
		img("https://example.com/cat.png", "auto"), img("data:image/jpeg;base64,"+jpegBase64(t, 2048, 4096), "auto")))
	require.Equal(t, int64(4), e.Breakdown.ImageCount)
	require.Equal(t, int64(765+85+estimate.UnknownImageOpenAI+1105), e.Breakdown.Images)
	require.Equal(t, text.Input+e.Breakdown.Images, e.Input) // images add nothing but their own tokens

	a := count(t, "claude-sonnet-4-5", `{"max_tokens":1,"messages":[{"role":"user","content":[`+
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+strings.TrimPrefix(pngDataURL(t, 1000, 1000), "data:image/png;base64,")+`"}},`+
		`{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"`+jpegBase64(t, 200, 200)+`"}},`+
		`{"type":"image","source":{"type":"url","url":"https://example.com/x.png"}}]}]}`)
	require.Equal(t, int64(1334+54+estimate.UnknownImageAnthropic), a.Breakdown.Images)
	require.Equal(t, int64(3), a.Breakdown.ImageCount)
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ model, body string }{
		"empty":                  {"gpt-4o", ``},
		"not json":               {"gpt-4o", `{`},
		"array":                  {"gpt-4o", `[]`},
		"no model":               {"", `{"messages":[{"role":"user","content":"x"}]}`},
		"no messages":            {"gpt-4o", `{}`},
		"messages not array":     {"gpt-4o", `{"messages":"x"}`},
		"no role":                {"gpt-4o", `{"messages":[{"content":"x"}]}`},
		"content number":         {"gpt-4o", `{"messages":[{"role":"user","content":5}]}`},
		"unknown part":           {"gpt-4o", `{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`},
		"image without url":      {"gpt-4o", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`},
		"bad detail":             {"gpt-4o", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x","detail":"max"}}]}]}`},
		"corrupt png":            {"gpt-4o", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`},
		"negative max_tokens":    {"gpt-4o", `{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`},
		"fractional max_tokens":  {"gpt-4o", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`},
		"anthropic no max":       {"claude-3", `{"messages":[{"role":"user","content":"x"}]}`},
		"anthropic bad role":     {"claude-3", `{"max_tokens":1,"messages":[{"role":"system","content":"x"}]}`},
		"anthropic no content":   {"claude-3", `{"max_tokens":1,"messages":[{"role":"user"}]}`},
		"anthropic image source": {"claude-3", `{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"image"}]}]}`},
	} {
		_, err := estimate.Count(estimate.Input{Model: tc.model, Request: json.RawMessage(tc.body)}, estimate.Options{})
		require.ErrorIs(t, err, estimate.ErrInvalid, name)
	}
	_, err := estimate.Count(estimate.Input{Model: "x", Provider: "google", Request: json.RawMessage(`{}`)}, estimate.Options{})
	require.ErrorIs(t, err, estimate.ErrInvalid)
}

// Fuzz: whatever the body, Count returns an InvalidError or an estimate whose parts add up
// and are not negative; it never panics.
func FuzzCount(f *testing.F) {
	f.Add("gpt-4o", "", `{"messages":[{"role":"user","content":"hello world"}],"max_tokens":10}`)
	f.Add("claude-3", "anthropic", `{"max_tokens":5,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`)
	f.Add("gpt-4", "openai", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="}}]}]}`)
	f.Add("", "", `{"model":"o3","messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`)
	f.Fuzz(func(t *testing.T, model, provider, body string) {
		e, err := estimate.Count(estimate.Input{Model: model, Provider: estimate.Provider(provider), Request: json.RawMessage(body)}, estimate.Options{})
		if err != nil {
			require.ErrorIs(t, err, estimate.ErrInvalid)
			return
		}
		require.GreaterOrEqual(t, e.Breakdown.Text, int64(0))
		require.GreaterOrEqual(t, e.Breakdown.Images, int64(0))
		require.GreaterOrEqual(t, e.Output, int64(0))
		require.Equal(t, e.Breakdown.Text+e.Breakdown.Overhead+e.Breakdown.Images, e.Input)
		require.Equal(t, e.Input+e.Output, e.Total)
		require.NotEmpty(t, e.Model)
	})
}
