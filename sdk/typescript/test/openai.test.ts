// The OpenAI usage helpers against the real openai package: its client over a fake fetch
// that serves JSON replies and SSE streams, so the objects and their types are the SDK's own.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import OpenAI from "openai";
import type { ChatCompletion, ChatCompletionChunk } from "openai/resources/chat/completions";
import type { Response as OpenAIResponse, ResponseStreamEvent } from "openai/resources/responses/responses";

import { openaiUsage, trackUsage, usageUnits, type Usage } from "../src/index.js";

const completion = {
  id: "chatcmpl-1",
  object: "chat.completion",
  created: 1795430840,
  model: "gpt-4o-mini",
  choices: [{ index: 0, message: { role: "assistant", content: "Hi", refusal: null }, finish_reason: "stop", logprobs: null }],
  usage: { prompt_tokens: 1200, completion_tokens: 34, total_tokens: 1234, prompt_tokens_details: { cached_tokens: 1000 } },
};

const chunk = (content: string, usage: unknown = null) => ({
  id: "chatcmpl-1",
  object: "chat.completion.chunk",
  created: 1795430840,
  model: "gpt-4o-mini",
  choices: content ? [{ index: 0, delta: { content }, finish_reason: null }] : [],
  usage,
});

const response = {
  id: "resp_1",
  object: "response",
  created_at: 1795430840,
  status: "completed",
  model: "gpt-4o-mini",
  output: [],
  usage: { input_tokens: 50, output_tokens: 8, total_tokens: 58, input_tokens_details: { cached_tokens: 0 }, output_tokens_details: { reasoning_tokens: 0 } },
};

function sse(events: { event?: string; data: unknown }[]): Response {
  const text = events.map((e) => (e.event ? `event: ${e.event}\n` : "") + `data: ${typeof e.data === "string" ? e.data : JSON.stringify(e.data)}\n\n`).join("");
  return new Response(text, { headers: { "Content-Type": "text/event-stream" } });
}

// An OpenAI client whose requests reply() answers, by path and whether a stream was asked.
function openai(reply: (path: string, body: { stream?: boolean; stream_options?: { include_usage?: boolean } }) => Response) {
  const bodies: unknown[] = [];
  const client = new OpenAI({
    apiKey: "sk-test",
    baseURL: "http://openai.test/v1",
    maxRetries: 0,
    fetch: async (input, init) => {
      const url = new URL(input instanceof Request ? input.url : String(input));
      const body = JSON.parse(String(init?.body ?? "{}")) as { stream?: boolean };
      bodies.push(body);
      return reply(url.pathname, body);
    },
  });
  return { client, bodies };
}

describe("openai usage", () => {
  it("reads a chat completion's usage", async () => {
    const { client } = openai(() => Response.json(completion));
    const c: ChatCompletion = await client.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "Hi" }] });
    const u = openaiUsage(c);
    assert.deepEqual(u, { tokens: 1234, input_tokens: 1200, output_tokens: 34, cached_input_tokens: 1000 });
    assert.deepEqual(usageUnits(u!), { tokens: 1234 });
  });

  it("reads a Responses API response's usage", async () => {
    const { client } = openai(() => Response.json(response));
    const r: OpenAIResponse = await client.responses.create({ model: "gpt-4o-mini", input: "Hi" });
    assert.deepEqual(openaiUsage(r), { tokens: 58, input_tokens: 50, output_tokens: 8, cached_input_tokens: 0 });
  });

  it("records a chat stream's usage from its last chunk, passing every chunk on", async () => {
    const { client, bodies } = openai(() =>
      sse([{ data: chunk("Hel") }, { data: chunk("lo") }, { data: chunk("", { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 }) }, { data: "[DONE]" }]),
    );
    const stream = await client.chat.completions.create({
      model: "gpt-4o-mini",
      messages: [{ role: "user", content: "Hi" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const seen: Usage[] = [];
    let text = "";
    const chunks: ChatCompletionChunk[] = [];
    for await (const c of trackUsage(stream, (u) => seen.push(u))) {
      chunks.push(c);
      text += c.choices[0]?.delta.content ?? "";
      assert.equal(seen.length, 0, "recorded at the end, not before");
    }
    assert.equal(text, "Hello");
    assert.equal(chunks.length, 3);
    assert.deepEqual(seen, [{ tokens: 11, input_tokens: 9, output_tokens: 2, cached_input_tokens: 0 }]);
    assert.deepEqual((bodies[0] as { stream_options: unknown }).stream_options, { include_usage: true });
  });

  it("records nothing for a stream without usage", async () => {
    const { client } = openai(() => sse([{ data: chunk("Hi") }, { data: "[DONE]" }]));
    const stream = await client.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "Hi" }], stream: true });
    const seen: Usage[] = [];
    for await (const _ of trackUsage(stream, (u) => seen.push(u))) void _;
    assert.deepEqual(seen, []);
  });

  it("records a Responses stream's usage from response.completed", async () => {
    const { client } = openai(() =>
      sse([
        { event: "response.output_text.delta", data: { type: "response.output_text.delta", item_id: "m", output_index: 0, content_index: 0, delta: "Hi", sequence_number: 1, logprobs: [] } },
        { event: "response.completed", data: { type: "response.completed", response, sequence_number: 2 } },
      ]),
    );
    const stream = await client.responses.create({ model: "gpt-4o-mini", input: "Hi", stream: true });
    const seen: Usage[] = [];
    const types: ResponseStreamEvent["type"][] = [];
    for await (const e of trackUsage(stream, (u) => seen.push(u))) types.push(e.type);
    assert.deepEqual(types, ["response.output_text.delta", "response.completed"]);
    assert.deepEqual(seen, [{ tokens: 58, input_tokens: 50, output_tokens: 8, cached_input_tokens: 0 }]);
  });

  it("records the usage when the reader stops after it came", async () => {
    async function* s() {
      yield chunk("", { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 });
      yield chunk("more");
    }
    const seen: Usage[] = [];
    for await (const _ of trackUsage(s(), (u) => seen.push(u))) break;
    assert.equal(seen.length, 1);
  });

  it("is tolerant of what it does not know, strict about what it reads", () => {
    assert.equal(openaiUsage(null), undefined);
    assert.equal(openaiUsage({ id: "x" }), undefined);
    assert.deepEqual(openaiUsage({ usage: { prompt_tokens: 3, total_tokens: 3, new_field: 1 } }), {
      tokens: 3,
      input_tokens: 3,
      output_tokens: 0,
      cached_input_tokens: 0,
    });
    assert.throws(() => openaiUsage({ usage: { prompt_tokens: -1 } }), /whole number/);
    assert.throws(() => openaiUsage({ usage: { foo: 1 } }), /neither prompt_tokens nor input_tokens/);
  });
});
