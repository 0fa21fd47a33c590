// The middleware's behaviour, through Hono (app.request(): no server) over a scripted admit.
// The core (Gate, Metering, OutcomeQueue) is the same for Express and withMetergate, whose
// tests check their translation of it.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Hono } from "hono";
import { streamText } from "hono/streaming";

import { type Metering, type RouteOptions } from "../src/index.js";
import { hono } from "../src/hono.js";
import { accepted, allowed, eventId, fakeAdmit, unavailable, until, type Step } from "./fake.js";

type Fake = ReturnType<typeof fakeAdmit>;

// setup is the test bundle: a Hono app behind the middleware over a fake admit; the handler
// reports {tokens: 42} and answers 201 with the event id it was given.
function setup(opts: Parameters<typeof fakeAdmit>[0] = {}, route?: RouteOptions) {
  const fake = fakeAdmit(opts);
  const served: (Metering | undefined)[] = [];
  const app = new Hono();
  app.use("/v1/*", hono(fake.gate, route));
  app.post("/v1/chat", (c) => {
    const m = c.get("metergate");
    served.push(m);
    m.reportUnits({ tokens: 42 });
    return c.json({ event: m.eventId ?? null }, 201);
  });
  app.post("/v1/boom", () => {
    throw new Error("boom");
  });
  const post = (headers: Record<string, string> = { Authorization: "Bearer mgk_alice" }, body = '{"q":1}', path = "/v1/chat") =>
    app.request(path, { method: "POST", headers, body });
  return { ...fake, app, served, post };
}

// Reads a reply's body (the outcome is queued when it has been sent), then waits for the
// queue to be done.
async function done(f: Fake, res: Response): Promise<string> {
  const text = await res.text();
  assert.equal(await f.gate.flush(2000), true, "the queue drains");
  return text;
}

describe("hono middleware", () => {
  it("admits the request, passes the event id on and reports the outcome with the units the handler set", async () => {
    const f = setup({}, { units: () => ({ tokens: 1000 }), tool: () => "llm_call" });
    const res = await f.post();
    assert.equal(res.status, 201);
    assert.deepEqual(JSON.parse(await done(f, res)), { event: eventId });
    assert.equal(res.headers.get("Metergate-Event-Id"), eventId);
    assert.equal(res.headers.get("RateLimit"), '"acme-requests";r=299;t=1');
    assert.equal(res.headers.get("RateLimit-Policy"), '"acme-requests";q=300;w=3');
    const [admit] = f.admits();
    assert.equal(admit!["api_key"], "mgk_alice");
    assert.deepEqual(admit!["units"], { tokens: 1000 });
    assert.equal(admit!["tool"], "llm_call");
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 201, units: { tokens: 42 } }]);
    assert.equal(f.gate.outcomes.stats.reported, 1);
  });

  it("reads the key from X-API-Key, or from a resolver", async () => {
    const f = setup();
    await done(f, await f.post({ "X-API-Key": "mgk_bob" }));
    assert.equal(f.admits()[0]!["api_key"], "mgk_bob");
    const g = setup({}, { account: (req) => req.headers.get("x-tenant") ?? undefined });
    await done(g, await g.post({ "X-Tenant": "acme-bob", Authorization: "Bearer ignored" }));
    assert.equal(g.admits()[0]!["account"], "acme-bob");
    assert.equal(g.admits()[0]!["api_key"], undefined);
  });

  it("answers 401 without a key, without asking admit", async () => {
    const f = setup();
    const res = await f.post({});
    assert.equal(res.status, 401);
    assert.equal(res.headers.get("WWW-Authenticate"), "Bearer");
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "missing_credentials");
    assert.equal(f.calls.length, 0);
    assert.equal(f.served.length, 0);
  });

  it("answers 429 with admit's body, RateLimit and Retry-After, without serving", async () => {
    const body = { decision: "rate_limited", account: "agent-1", org: "acme", blocked_by: { account: "acme", level: "org", unit: "requests" }, retry_after_ms: 1500 };
    const f = setup({
      admit: [{ status: 429, body, headers: { "Retry-After": "2", RateLimit: '"acme-requests";r=0;t=2', "RateLimit-Policy": '"acme-requests";q=300;w=3' } }],
    });
    const res = await f.post();
    assert.equal(res.status, 429);
    assert.equal(res.headers.get("Retry-After"), "2");
    assert.equal(res.headers.get("RateLimit"), '"acme-requests";r=0;t=2');
    assert.equal(res.headers.get("RateLimit-Policy"), '"acme-requests";q=300;w=3');
    assert.equal(res.headers.get("Content-Type"), "application/json");
    assert.deepEqual(await res.json(), body);
    assert.equal(f.served.length, 0);
    assert.equal(f.admits().length, 1, "a refusal is not retried");
    assert.equal(f.outcomes().length, 0);
  });

  it("answers 402 with admit's body and RateLimit, without serving", async () => {
    const body = { decision: "quota_exceeded", account: "agent-1", org: "acme", blocked_by: { account: "acme", level: "org", unit: "tokens" }, period: "2026-11" };
    const f = setup({ admit: [{ status: 402, body, headers: { RateLimit: '"acme-tokens-quota";r=0;t=86400' } }] });
    const res = await f.post();
    assert.equal(res.status, 402);
    assert.equal(res.headers.get("RateLimit"), '"acme-tokens-quota";r=0;t=86400');
    assert.deepEqual(await res.json(), body);
    assert.equal(f.served.length, 0);
  });

  for (const [status, code] of [
    [401, "unknown_api_key"],
    [403, "revoked_api_key"],
  ] as const) {
    it(`answers ${status} when admit refuses the caller's key (${code})`, async () => {
      const body = { error: { code, message: "no" } };
      const f = setup({ admit: [{ status, body }] });
      const res = await f.post();
      assert.equal(res.status, status);
      assert.deepEqual(await res.json(), body);
      assert.equal(f.served.length, 0);
    });
  }

  it("answers 503 when admit refuses the service's own token, even failing open", async () => {
    const f = setup({ admit: [{ status: 401, body: { error: { code: "unauthorized", message: "no valid bearer token" } } }] }, { failOpen: true });
    const res = await f.post();
    assert.equal(res.status, 503);
    assert.equal(f.served.length, 0);
    assert.equal(f.logger.lines.length, 1);
  });

  it("fails closed, 503 with Retry-After, when admit cannot decide", async () => {
    const f = setup({ admit: [unavailable, unavailable, unavailable, unavailable] });
    const res = await f.post();
    assert.equal(res.status, 503);
    assert.equal(res.headers.get("Retry-After"), "1");
    assert.deepEqual(await res.json(), { error: { code: "unavailable", message: "metering is unavailable; retry later" } });
    assert.equal(f.admits().length, 4, "the client's retries first");
    assert.equal(f.served.length, 0);
    const g = setup({ admit: [new TypeError("fetch failed"), new TypeError("fetch failed"), new TypeError("fetch failed"), new TypeError("fetch failed")] });
    assert.equal((await g.post()).status, 503);
  });

  it("fails open when told: served unbilled, counted, no outcome", async () => {
    const f = setup({ admit: [unavailable, unavailable, unavailable, unavailable] }, { failOpen: true });
    const res = await f.post();
    assert.equal(res.status, 201);
    assert.deepEqual(JSON.parse(await done(f, res)), { event: null });
    assert.equal(f.served[0]!.admission, undefined);
    assert.equal(f.gate.outcomes.stats.unbilled, 1);
    assert.equal(f.outcomes().length, 0);
  });

  it("retries admit with the same key, and serves the request once", async () => {
    const f = setup({ admit: [unavailable, new TypeError("fetch failed"), allowed({ replayed: true })] });
    const res = await f.post();
    assert.equal(res.status, 201, "a replay of its own key is this request's own retry");
    await done(f, res);
    const keys = f.admits().map((a) => a["idempotency_key"]);
    assert.equal(keys.length, 3);
    assert.equal(typeof keys[0], "string");
    assert.ok(keys.every((k) => k === keys[0]), `one key for every try: ${keys.join(", ")}`);
    assert.equal(f.served.length, 1);
    assert.equal(f.outcomes().length, 1);
  });

  it("gives every request a key of its own when the caller sends none", async () => {
    const f = setup();
    await done(f, await f.post());
    await done(f, await f.post());
    const [a, b] = f.admits().map((x) => x["idempotency_key"]);
    assert.notEqual(a, b);
  });

  it("never sends the caller's Idempotency-Key as it is: reused on other requests, each is charged", async () => {
    const f = setup();
    const h = { Authorization: "Bearer mgk_alice", "Idempotency-Key": "k1" };
    await done(f, await f.post(h, '{"q":1}'));
    await done(f, await f.post(h, '{"q":2}'));
    await done(f, await f.post({ ...h, Authorization: "Bearer mgk_bob" }, '{"q":1}'));
    await done(f, await f.post(h, '{"q":1}', "/v1/chat?x=1"));
    const keys = f.admits().map((a) => a["idempotency_key"] as string);
    assert.equal(new Set(keys).size, 4, `other body, caller or query: other key (${keys.join(", ")})`);
    assert.ok(keys.every((k) => /^mw-[0-9a-f]{48}$/.test(k)));
    assert.equal(f.served.length, 4);
  });

  it("refuses a resend of a request already served, 409, without serving it", async () => {
    const f = setup({ admit: [allowed(), allowed({ replayed: true })] });
    const h = { Authorization: "Bearer mgk_alice", "Idempotency-Key": "k1" };
    await done(f, await f.post(h));
    const res = await f.post(h);
    assert.equal(res.status, 409);
    assert.equal(res.headers.get("Idempotent-Replayed"), "true");
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "idempotency_key_replayed");
    const [k1, k2] = f.admits().map((a) => a["idempotency_key"]);
    assert.equal(k1, k2, "the same request, the same key");
    assert.equal(f.served.length, 1);
    assert.equal(f.outcomes().length, 1);
  });

  it("leaves the body for the handler after hashing it", async () => {
    const f = fakeAdmit();
    const app = new Hono();
    app.use("*", hono(f.gate));
    app.post("/", async (c) => c.text(await c.req.text()));
    const res = await app.request("/", { method: "POST", headers: { Authorization: "Bearer k", "Idempotency-Key": "k1" }, body: "hello" });
    assert.equal(await res.text(), "hello");
  });

  it("reports a handler's error as 500", async () => {
    const f = setup();
    const res = await f.post(undefined, "{}", "/v1/boom");
    assert.equal(res.status, 500);
    await done(f, res);
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 500 }]);
  });

  it("reports a stream's tokens once its body has been sent", async () => {
    const f = fakeAdmit();
    const app = new Hono();
    app.use("*", hono(f.gate));
    async function* model() {
      yield { choices: [{ delta: { content: "Hello" } }], usage: null };
      yield { choices: [{ delta: { content: " world" } }], usage: null };
      yield { choices: [], usage: { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 } };
    }
    app.post("/", (c) =>
      streamText(c, async (s) => {
        for await (const chunk of c.get("metergate").track(model())) await s.write(chunk.choices[0]?.delta.content ?? "");
      }),
    );
    const res = await app.request("/", { method: "POST", headers: { Authorization: "Bearer k" } });
    assert.equal(f.gate.outcomes.pending + f.outcomes().length, 0, "nothing reported before the body is sent");
    assert.equal(await done(f, res), "Hello world");
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 200, units: { tokens: 13 } }]);
  });

  it("reports an outcome again with the same event id after a 503", async () => {
    const f = setup({ outcomes: [unavailable, new TypeError("fetch failed"), accepted] });
    await done(f, await f.post());
    const sent = f.outcomes();
    assert.equal(sent.length, 3);
    assert.ok(sent.every((o) => JSON.stringify(o) === JSON.stringify(sent[0])), "every try is the same report");
    assert.equal(f.gate.outcomes.stats.reported, 1);
  });

  it("never holds a reply while admit hangs on outcomes; drops and counts past the queue's size", async () => {
    const outcomes: Step[] = Array.from({ length: 20 }, () => "hang" as const);
    const f = setup({ outcomes, queue: { maxSize: 5, workers: 1 } });
    for (let i = 0; i < 20; i++) {
      const res = await f.post();
      assert.equal(res.status, 201);
      await res.text();
    }
    // 20 replies sent while the first outcome is still unanswered: 1 in flight, 5 queued.
    assert.equal(f.hung(), 1);
    assert.equal(f.gate.outcomes.pending, 6);
    assert.equal(f.gate.outcomes.stats.dropped, 14);
    assert.equal(await f.gate.flush(20), false, "flush gives up at its deadline");
    const release = setInterval(f.release, 1);
    try {
      assert.equal(await f.gate.flush(2000), true);
    } finally {
      clearInterval(release);
    }
    assert.equal(f.gate.outcomes.stats.reported, 6);
  });

  it("never holds a reply while admit is down for outcomes; counts the failures", async () => {
    const down = Array.from({ length: 12 }, () => new TypeError("fetch failed"));
    const f = setup({ outcomes: down });
    for (let i = 0; i < 3; i++) {
      const res = await f.post();
      assert.equal(res.status, 201);
      await res.text();
    }
    await until(() => f.gate.outcomes.stats.failed === 3, "three failed reports");
    assert.equal(f.outcomes().length, 12, "each retried up to the client's attempts");
    assert.equal(f.gate.outcomes.stats.reported, 0);
  });

  it("skips what it is told to", async () => {
    const f = setup({}, { skip: (req) => new URL(req.url).pathname === "/v1/chat" });
    const res = await f.post({});
    assert.equal(res.status, 201);
    await done(f, res);
    assert.equal(f.calls.length, 0);
  });
});
