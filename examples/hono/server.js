// @ts-check
// A Hono app serving a fake chat model (OpenAI's chat completions shape, deterministic token
// counts) behind @metergate/client's Hono middleware: each request is admitted with an
// estimate of its tokens, and the tokens the model really used go to admit as the outcome.
//
//   METERGATE_URL=http://127.0.0.1:8080 METERGATE_SERVICE_TOKEN=… PORT=9000 npm start
//
// README.md has the whole walk-through. The same app as examples/fastapi, in TypeScript's
// ecosystem.
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { streamSSE } from "hono/streaming";
import { Client, Gate } from "@metergate/client";
import { hono } from "@metergate/client/hono";

/** The most tokens the fake model answers with: the estimate charges them up front. */
const MAX_OUTPUT_TOKENS = 256;

const missing = ["METERGATE_URL", "METERGATE_SERVICE_TOKEN"].filter((n) => !process.env[n]);
if (missing.length > 0) {
  console.error(`set ${missing.join(" and ")}: admit's address and its service token`);
  process.exit(2);
}
const port = Number(process.env.PORT ?? 3000);

const client = new Client({ baseUrl: String(process.env.METERGATE_URL), token: String(process.env.METERGATE_SERVICE_TOKEN) });
const gate = new Gate({
  client,
  // Before the body is read: about 4 bytes of JSON per input token, plus the most the model
  // may answer. The outcome's actual tokens settle the difference.
  units: (req) => ({ tokens: Math.ceil(Number(req.headers.get("content-length") ?? 0) / 4) + MAX_OUTPUT_TOKENS }),
  skip: (req) => new URL(req.url).pathname === "/healthz",
  failOpen: process.env.METERGATE_FAIL_OPEN === "1",
});

/**
 * A chat completion as OpenAI answers it, deterministic: the reply echoes the last message's
 * first words; a token is a word, plus 4 per message.
 * @param {{model: string, messages: {role: string, content: string}[]}} req
 */
function fakeModel(req) {
  const words = (req.messages.at(-1)?.content ?? "").split(/\s+/).filter(Boolean);
  const answer = ["You", "said:", ...words].slice(0, MAX_OUTPUT_TOKENS).join(" ");
  const promptTokens = req.messages.reduce((n, m) => n + m.content.split(/\s+/).filter(Boolean).length + 4, 0);
  const completionTokens = answer.split(" ").length;
  return {
    id: `chatcmpl-${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: req.model,
    choices: [{ index: 0, message: { role: "assistant", content: answer }, finish_reason: "stop" }],
    usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
  };
}

/**
 * The completion as OpenAI streams it with stream_options {include_usage: true}: a chunk per
 * word, then one with the usage and no choices.
 * @param {ReturnType<typeof fakeModel>} completion
 */
async function* fakeStream(completion) {
  const chunk = { id: completion.id, object: "chat.completion.chunk", created: completion.created, model: completion.model, usage: null };
  const words = completion.choices[0]?.message.content.split(" ") ?? [];
  for (const [i, word] of words.entries()) {
    yield { ...chunk, choices: [{ index: 0, delta: { content: i === 0 ? word : " " + word }, finish_reason: null }] };
  }
  yield { ...chunk, choices: [{ index: 0, delta: {}, finish_reason: "stop" }] };
  yield { ...chunk, choices: [], usage: completion.usage };
}

const app = new Hono();
app.use("*", hono(gate));

app.post("/v1/chat/completions", async (c) => {
  const body = await c.req.json();
  if (!Array.isArray(body?.messages) || body.messages.some((/** @type {any} */ m) => typeof m?.content !== "string")) {
    return c.json({ error: { code: "invalid_request", message: "messages: a list of {role, content}" } }, 400);
  }
  const completion = fakeModel(body); // a real app: await openai.chat.completions.create(…)
  const metering = c.get("metergate");
  if (!body.stream) {
    metering.reportOpenAI(completion); // {tokens: usage.total_tokens}, sent with the outcome
    return c.json(completion);
  }
  // A stream's usage comes in its last chunk: track() reports it when the stream ends, and the
  // outcome goes once the reply's body has been sent.
  return streamSSE(c, async (sse) => {
    for await (const chunk of metering.track(fakeStream(completion))) await sse.writeSSE({ data: JSON.stringify(chunk) });
    await sse.writeSSE({ data: "[DONE]" });
  });
});

app.get("/healthz", (c) => c.json({ status: "ok" }));

const server = serve({ fetch: app.fetch, port, hostname: process.env.HOST ?? "127.0.0.1" }, (info) => {
  console.log(`listening on :${info.port}`);
});

// On SIGTERM or SIGINT: stop taking requests, send the outcomes still queued, then exit.
for (const signal of /** @type {const} */ (["SIGTERM", "SIGINT"])) {
  process.once(signal, () => {
    server.close();
    gate.flush(5000).then((drained) => {
      if (!drained) console.error(`metergate: ${gate.outcomes.pending} outcomes not sent before shutdown`);
      process.exit(0);
    });
  });
}
