// Package estimate counts the tokens of an LLM request before it is sent: the input from an
// OpenAI chat-completions or Anthropic messages body (text with the model's BPE encoding, or
// a character-based fallback, plus per-message overheads and images by the providers'
// formulas), and the expected output from max_tokens or a configured default. admit charges
// the estimate as the request's tokens; reconcile settles it against the actual count.
package estimate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tiktoken-go/tokenizer"
)

// Provider is the API whose body is estimated.
type Provider string

// Providers.
const (
	OpenAI    Provider = "openai"
	Anthropic Provider = "anthropic"
)

// Methods: how text is counted.
const (
	MethodO200k    = "o200k_base"
	MethodCl100k   = "cl100k_base"
	MethodFallback = "chars/3.5"
)

// Per-message overheads of OpenAI chat models (OpenAI cookbook, "How to count tokens with
// tiktoken"): every message costs 3 tokens beyond its content, a name 1 more, and every
// reply is primed with 3 (<|start|>assistant<|message|>). Anthropic documents none.
const (
	TokensPerMessage = 3
	TokensPerName    = 1
	TokensReplyPrime = 3
)

// Image assumptions when a body does not give the image's size (a remote URL: nothing is
// fetched, or a format other than PNG and JPEG).
const (
	// UnknownImageOpenAI is a square image at high detail: 85 + 170×4 tiles.
	UnknownImageOpenAI = 765
	// UnknownImageAnthropic is Anthropic's largest image after resizing (~1.15 megapixels).
	UnknownImageAnthropic = 1600
)

// DefaultOutput is the output assumed for an OpenAI body without max_tokens or
// max_completion_tokens when Options.DefaultOutput is not set.
const DefaultOutput = 1024

// Options configure an estimate.
type Options struct {
	// DefaultOutput is the output assumed when the body bounds none (OpenAI only; Anthropic
	// requires max_tokens). DefaultOutput when zero.
	DefaultOutput int64
}

// Input is what to estimate: the provider's request body, the model (the body's model when
// empty) and the provider (inferred from the model and the body when empty).
type Input struct {
	Model    string
	Provider Provider
	Request  json.RawMessage
}

// Breakdown splits the input tokens by what they count.
type Breakdown struct {
	Text       int64 `json:"text"`
	Overhead   int64 `json:"overhead"`
	Images     int64 `json:"images"`
	ImageCount int64 `json:"image_count"`
}

// Estimate is the estimated size of one request.
type Estimate struct {
	Model    string   `json:"model"`
	Provider Provider `json:"provider"`
	// Method is the encoding that counted the text, or MethodFallback.
	Method string `json:"method"`
	Input  int64  `json:"input_tokens"`
	Output int64  `json:"output_tokens"`
	Total  int64  `json:"total_tokens"`
	// OutputFrom says where Output came from: max_tokens, max_completion_tokens or default.
	OutputFrom string    `json:"output_from"`
	Breakdown  Breakdown `json:"breakdown"`
}

// InvalidError is a request that cannot be estimated: not the shape of either provider's body.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return "cannot estimate: " + e.Reason }

func invalid(format string, args ...any) error {
	return &InvalidError{Reason: fmt.Sprintf(format, args...)}
}

// ErrInvalid matches every InvalidError with errors.Is.
var ErrInvalid = errors.New("cannot estimate")

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// The encodings load their vocabularies (embedded in the tokenizer module) on first use:
// a few hundred milliseconds each that admit's start-up does not pay.
var (
	o200k  = sync.OnceValues(func() (tokenizer.Codec, error) { return tokenizer.Get(tokenizer.O200kBase) })
	cl100k = sync.OnceValues(func() (tokenizer.Codec, error) { return tokenizer.Get(tokenizer.Cl100kBase) })
)

// MethodFor names how a model's text is counted: o200k_base for the GPT-4o, GPT-4.1, GPT-5
// and o1/o3/o4 families, cl100k_base for GPT-4 and GPT-3.5, the character fallback for
// everything else (Claude included: Anthropic publishes no tokenizer).
func MethodFor(model string) string {
	m := strings.ToLower(strings.TrimPrefix(model, "ft:"))
	family := func(prefixes ...string) bool {
		for _, p := range prefixes {
			if m == p || strings.HasPrefix(m, p+"-") || strings.HasPrefix(m, p+":") {
				return true
			}
		}
		return false
	}
	switch {
	case family("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4"):
		return MethodO200k
	case family("gpt-4", "gpt-3.5", "gpt-35"):
		return MethodCl100k
	}
	return MethodFallback
}

// counter counts the tokens of text pieces with one method.
type counter struct {
	codec tokenizer.Codec // nil: the fallback
	chars int64           // the fallback's characters so far
	text  int64
}

func newCounter(method string) (*counter, error) {
	var (
		c   tokenizer.Codec
		err error
	)
	switch method {
	case MethodO200k:
		c, err = o200k()
	case MethodCl100k:
		c, err = cl100k()
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", method, err)
	}
	return &counter{codec: c}, nil
}

func (c *counter) add(s string) error {
	if s == "" {
		return nil
	}
	if c.codec == nil {
		c.chars += int64(utf8.RuneCountInString(s))
		return nil
	}
	n, err := c.codec.Count(s)
	if err != nil {
		return invalid("text cannot be tokenized: %v", err)
	}
	c.text += int64(n)
	return nil
}

// tokens is the text's count: the fallback rounds ceil(chars / 3.5) once, over all text.
func (c *counter) tokens() int64 {
	if c.codec == nil {
		return (c.chars*2 + 6) / 7
	}
	return c.text
}

// Count estimates in's request.
func Count(in Input, opt Options) (Estimate, error) {
	if len(in.Request) == 0 {
		return Estimate{}, invalid("request is required: an OpenAI chat-completions or Anthropic messages body")
	}
	var head struct {
		Model  string          `json:"model"`
		System json.RawMessage `json:"system"`
	}
	if err := json.Unmarshal(in.Request, &head); err != nil {
		return Estimate{}, invalid("request is not a JSON object of the expected shape: %v", jsonReason(err))
	}
	model := in.Model
	if model == "" {
		model = head.Model
	}
	if model == "" {
		return Estimate{}, invalid("model is required (in estimate or in the request)")
	}
	prov := in.Provider
	switch prov {
	case "":
		prov = OpenAI
		if strings.HasPrefix(strings.ToLower(model), "claude") || len(head.System) > 0 {
			prov = Anthropic
		}
	case OpenAI, Anthropic:
	default:
		return Estimate{}, invalid("provider %q is not known (openai or anthropic)", prov)
	}
	e := Estimate{Model: model, Provider: prov, Method: MethodFor(model)}
	c, err := newCounter(e.Method)
	if err != nil {
		return Estimate{}, err
	}
	if prov == OpenAI {
		err = countOpenAI(in.Request, c, &e, opt)
	} else {
		err = countAnthropic(in.Request, c, &e)
	}
	if err != nil {
		return Estimate{}, err
	}
	e.Breakdown.Text = c.tokens()
	e.Input = e.Breakdown.Text + e.Breakdown.Overhead + e.Breakdown.Images
	e.Total = e.Input + e.Output
	return e, nil
}

// jsonReason shortens encoding/json's errors for a reply.
func jsonReason(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		if ute.Field == "" {
			return "want " + ute.Type.String() + ", got " + ute.Value
		}
		return fmt.Sprintf("field %q must be %s, got %s", ute.Field, ute.Type.String(), ute.Value)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// maxOutput reads a max_tokens-like bound: absent (ok false), or a non-negative integer.
func maxOutput(name string, raw json.RawMessage) (int64, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
		return 0, false, invalid("%s must be a non-negative whole number", name)
	}
	return n, true, nil
}
