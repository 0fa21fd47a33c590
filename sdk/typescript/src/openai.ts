// The tokens an OpenAI call used, read from the openai Node SDK's responses and stream chunks
// (or their JSON), so that actual tokens reach outcomes without hand-written parsing. The
// shapes are read at run time, not imported: the package does not depend on openai.
//
// What counts: metergate has one unit for a model's work, `tokens` (docs/admission.md,
// "Units"), and admit's estimate counts every input token and the output it may produce. So
// the units are {tokens: input_tokens + output_tokens}, with
//
//   Usage field          Chat Completions                     Responses
//   input_tokens         prompt_tokens                        input_tokens
//   output_tokens        completion_tokens                    output_tokens
//   cached_input_tokens  prompt_tokens_details.cached_tokens  input_tokens_details.cached_tokens
//
// Cached and reasoning tokens count in full: a price per kind of token belongs in
// cost_micros, computed by the caller. input_tokens and output_tokens are not metergate
// units: admit refuses an outcome that carries them, so report usageUnits(usage).

import type { Units } from "./client.js";

/** The tokens one model call used (see the table above). */
export interface Usage {
  /** What metergate counts: input_tokens + output_tokens. */
  tokens: number;
  /** Every input token the model read, cached ones included. */
  input_tokens: number;
  /** Every output token, reasoning included. */
  output_tokens: number;
  /** Of input_tokens, those read from the provider's prompt cache. */
  cached_input_tokens: number;
}

type Fields = Record<string, unknown>;

function isObject(v: unknown): v is Fields {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function count(u: Fields, name: string, required = true): number {
  const v = u[name];
  if ((v === undefined || v === null) && !required) return 0;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new TypeError(`usage.${name} must be a whole number >= 0, not ${JSON.stringify(v)}`);
  }
  return v;
}

function usage(input: number, output: number, cached: number): Usage {
  return { tokens: input + output, input_tokens: input, output_tokens: output, cached_input_tokens: cached };
}

function fromUsage(u: Fields): Usage {
  if (u["prompt_tokens"] !== undefined && u["prompt_tokens"] !== null) {
    // Chat Completions, Completions, Embeddings (no completion_tokens).
    const details = isObject(u["prompt_tokens_details"]) ? u["prompt_tokens_details"] : {};
    return usage(count(u, "prompt_tokens"), count(u, "completion_tokens", false), count(details, "cached_tokens", false));
  }
  if (u["input_tokens"] !== undefined && u["input_tokens"] !== null) {
    const details = isObject(u["input_tokens_details"]) ? u["input_tokens_details"] : {};
    return usage(count(u, "input_tokens"), count(u, "output_tokens"), count(details, "cached_tokens", false));
  }
  throw new TypeError("not an OpenAI usage: it has neither prompt_tokens nor input_tokens");
}

/**
 * The usage of an OpenAI ChatCompletion, Completion, embeddings reply, Response (Responses
 * API), a Chat Completions stream's usage chunk or a Responses stream's response.completed
 * (.incomplete, .failed) event; undefined when it carries none (a chunk before the last, a
 * stream without `stream_options: {include_usage: true}`). TypeError on a malformed usage.
 */
export function openaiUsage(response: object | null | undefined): Usage | undefined {
  if (!isObject(response)) return undefined;
  let u = response["usage"];
  if ((u === undefined || u === null) && isObject(response["response"])) u = response["response"]["usage"];
  if (u === undefined || u === null) return undefined;
  if (!isObject(u)) throw new TypeError("usage must be an object");
  return fromUsage(u);
}

/** metergate's units for an outcome: {tokens: input_tokens + output_tokens}. */
export function usageUnits(u: Usage): Units {
  return { tokens: u.tokens };
}

/**
 * Passes every chunk of an OpenAI stream on unchanged and calls onUsage once with the usage
 * its chunks carried, when the stream ends or the consumer stops reading after the usage came
 * (a Chat Completions stream sends it last, and only with stream_options.include_usage). A
 * stream cut short before its usage came calls nothing: the admitted estimate stands.
 */
export async function* trackUsage<T>(stream: AsyncIterable<T>, onUsage: (usage: Usage) => void): AsyncGenerator<T, void, undefined> {
  let seen: Usage | undefined;
  try {
    for await (const chunk of stream) {
      const u = typeof chunk === "object" && chunk !== null ? openaiUsage(chunk) : undefined;
      if (u !== undefined) seen = u;
      yield chunk;
    }
  } finally {
    if (seen !== undefined) onUsage(seen);
  }
}
