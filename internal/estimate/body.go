package estimate

import (
	"bytes"
	"encoding/json"
)

// The bodies are read leniently, as the providers add fields: only the fields that hold
// text, images or the output bound are read, and their shapes are checked.

type openAIBody struct {
	Messages            []openAIMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
}

type openAIMessage struct {
	Role      string          `json:"role"`
	Name      string          `json:"name"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type openAIPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL *struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"image_url"`
}

func countOpenAI(raw json.RawMessage, c *counter, e *Estimate, opt Options) error {
	var b openAIBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return invalid("not an OpenAI chat-completions body: %s", jsonReason(err))
	}
	if len(b.Messages) == 0 {
		return invalid("messages must be a non-empty array")
	}
	for i, m := range b.Messages {
		if m.Role == "" {
			return invalid("messages[%d].role is required", i)
		}
		e.Breakdown.Overhead += TokensPerMessage
		if err := c.add(m.Role); err != nil {
			return err
		}
		if m.Name != "" {
			e.Breakdown.Overhead += TokensPerName
			if err := c.add(m.Name); err != nil {
				return err
			}
		}
		for _, call := range m.ToolCalls {
			if err := c.add(call.Function.Name); err != nil {
				return err
			}
			if err := c.add(call.Function.Arguments); err != nil {
				return err
			}
		}
		if err := openAIContent(m.Content, i, c, e); err != nil {
			return err
		}
	}
	e.Breakdown.Overhead += TokensReplyPrime
	if err := addRaw(b.Tools, c); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"max_completion_tokens", b.MaxCompletionTokens}, {"max_tokens", b.MaxTokens}} {
		n, ok, err := maxOutput(f.name, f.raw)
		if err != nil {
			return err
		}
		if ok && e.OutputFrom == "" {
			e.Output, e.OutputFrom = n, f.name
		}
	}
	if e.OutputFrom == "" {
		e.Output, e.OutputFrom = opt.DefaultOutput, "default"
		if e.Output <= 0 {
			e.Output = DefaultOutput
		}
	}
	return nil
}

func openAIContent(raw json.RawMessage, i int, c *counter, e *Estimate) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil // an assistant message with tool calls only
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalid("messages[%d].content: %s", i, jsonReason(err))
		}
		return c.add(s)
	}
	var parts []openAIPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return invalid("messages[%d].content must be a string or an array of parts: %s", i, jsonReason(err))
	}
	for j, p := range parts {
		switch p.Type {
		case "text":
			if err := c.add(p.Text); err != nil {
				return err
			}
		case "refusal":
			if err := c.add(p.Refusal); err != nil {
				return err
			}
		case "image_url":
			if p.ImageURL == nil || p.ImageURL.URL == "" {
				return invalid("messages[%d].content[%d].image_url.url is required", i, j)
			}
			n, err := openAIImage(p.ImageURL.URL, p.ImageURL.Detail)
			if err != nil {
				return invalid("messages[%d].content[%d]: %v", i, j, err)
			}
			e.Breakdown.Images += n
			e.Breakdown.ImageCount++
		default:
			return invalid("messages[%d].content[%d].type %q is not estimated (text, refusal, image_url)", i, j, p.Type)
		}
	}
	return nil
}

type anthropicBody struct {
	System    json.RawMessage    `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Tools     json.RawMessage    `json:"tools"`
	MaxTokens json.RawMessage    `json:"max_tokens"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	Thinking string          `json:"thinking"`
	Name     string          `json:"name"`
	Input    json.RawMessage `json:"input"`
	Content  json.RawMessage `json:"content"` // tool_result: a string or blocks
	Source   *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
	} `json:"source"`
}

func countAnthropic(raw json.RawMessage, c *counter, e *Estimate) error {
	var b anthropicBody
	if err := json.Unmarshal(raw, &b); err != nil {
		return invalid("not an Anthropic messages body: %s", jsonReason(err))
	}
	if len(b.Messages) == 0 {
		return invalid("messages must be a non-empty array")
	}
	n, ok, err := maxOutput("max_tokens", b.MaxTokens)
	if err != nil {
		return err
	}
	if !ok {
		return invalid("max_tokens is required in an Anthropic messages body")
	}
	e.Output, e.OutputFrom = n, "max_tokens"
	if err := anthropicContent(b.System, "system", 0, c, e); err != nil {
		return err
	}
	for i, m := range b.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return invalid("messages[%d].role must be user or assistant", i)
		}
		if len(bytes.TrimSpace(m.Content)) == 0 {
			return invalid("messages[%d].content is required", i)
		}
		if err := anthropicContent(m.Content, "messages", i, c, e); err != nil {
			return err
		}
	}
	return addRaw(b.Tools, c)
}

// anthropicContent counts a string or an array of content blocks; depth bounds tool_result
// nesting.
func anthropicContent(raw json.RawMessage, where string, depth int, c *counter, e *Estimate) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return invalid("%s: %s", where, jsonReason(err))
		}
		return c.add(s)
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return invalid("%s content must be a string or an array of blocks: %s", where, jsonReason(err))
	}
	for j, bl := range blocks {
		var err error
		switch bl.Type {
		case "text":
			err = c.add(bl.Text)
		case "thinking":
			err = c.add(bl.Thinking)
		case "tool_use":
			if err = c.add(bl.Name); err == nil {
				err = addRaw(bl.Input, c)
			}
		case "tool_result":
			if depth > 0 {
				return invalid("%s: a tool_result inside a tool_result", where)
			}
			err = anthropicContent(bl.Content, where, depth+1, c, e)
		case "image":
			if bl.Source == nil {
				return invalid("%s block %d: image.source is required", where, j)
			}
			var n int64
			n, err = anthropicImage(bl.Source.Type, bl.Source.MediaType, bl.Source.Data)
			if err != nil {
				return invalid("%s block %d: %v", where, j, err)
			}
			e.Breakdown.Images += n
			e.Breakdown.ImageCount++
		default:
			return invalid("%s block %d: type %q is not estimated (text, thinking, tool_use, tool_result, image)", where, j, bl.Type)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// addRaw counts a JSON value (tool definitions, tool inputs) by its text: what the
// provider renders into the prompt is close to it.
func addRaw(raw json.RawMessage, c *counter) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return c.add(string(raw))
}
