// Against a real admit: METERGATE_URL, METERGATE_SERVICE_TOKEN, METERGATE_ADMIN_TOKEN and
// METERGATE_ACCOUNT (an org with ample limits) are set by sdk/sdk_test.go, which starts admit
// on the stack and fails when anything here is skipped. Without METERGATE_URL each test
// skips (counted in node --test's "# skipped").
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Hono } from "hono";

import { Client, ForbiddenError, Gate, MetergateError, OutcomeQueue, UnauthorizedError, type Metering } from "../src/index.js";
import { hono } from "../src/hono.js";
import { quietLogger } from "./fake.js";

const env = {
  url: process.env["METERGATE_URL"] ?? "",
  service: process.env["METERGATE_SERVICE_TOKEN"] ?? "",
  admin: process.env["METERGATE_ADMIN_TOKEN"] ?? "",
  account: process.env["METERGATE_ACCOUNT"] ?? "",
};
const skip = env.url === "" ? "METERGATE_URL is not set: `go test ./sdk/ -run TestTypeScript` starts admit and sets it" : false;

// A name no other run of this suite has used.
const unique = (what: string) => `${env.account}-${what}-${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;

// Polls f until it returns a value, for what reaches admit's policies within a second
// (accounts and API keys, by LISTEN/NOTIFY).
async function eventually<T>(what: string, f: () => Promise<T | undefined>, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("against a real admit", () => {
  const service = new Client({ baseUrl: env.url, token: env.service });
  const admin = new Client({ baseUrl: env.url, token: env.admin });

  it("admits a request and takes its outcome", { skip }, async () => {
    const a = await service.admit({ account: env.account, units: { tokens: 120 } });
    assert.equal(a.org, env.account);
    assert.equal(a.account, env.account);
    assert.equal(a.replayed, false);
    assert.match(a.eventId, new RegExp(`\\.${env.account}$`));
    assert.match(a.headers.get("RateLimit") ?? "", /r=\d+/);
    const o = await service.outcome({ eventId: a.eventId, status: 200, units: { tokens: 97 } });
    assert.deepEqual(o, { status: "accepted", event_id: a.eventId });
  });

  it("answers a replay of a key with the first decision, charged once", { skip }, async () => {
    const key = unique("key");
    const first = await service.admit({ account: env.account, units: { tokens: 5 }, idempotencyKey: key });
    const again = await service.admit({ account: env.account, units: { tokens: 5 }, idempotencyKey: key });
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    assert.equal(again.eventId, first.eventId);
    await assert.rejects(service.admit({ account: env.account, units: { tokens: 6 }, idempotencyKey: key }), (e: unknown) => {
      assert.ok(e instanceof MetergateError);
      assert.equal(e.status, 422);
      assert.equal(e.code, "idempotency_key_reused");
      return true;
    });
  });

  it("calls the admin and service APIs through client.api, typed", { skip }, async () => {
    const { data: account } = await admin.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: env.account } } });
    assert.equal(account.id, env.account);
    assert.equal(account.kind, "org");
    const { data: key, response } = await admin.api.POST("/v1/admin/api-keys", { body: { account: env.account } });
    assert.equal(response.status, 201);
    assert.equal(key.account, env.account);
    assert.ok(key.api_key.length > 0);
    const { data: usage } = await service.api.GET("/v1/usage/{account}", { params: { path: { account: env.account } } });
    assert.equal(usage.account, env.account);
    await assert.rejects(service.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: env.account } } }), ForbiddenError);
    await assert.rejects(admin.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: unique("none") } } }), (e: unknown) => {
      assert.ok(e instanceof MetergateError);
      assert.equal(e.status, 404);
      return true;
    });
  });

  it("admits through the Hono middleware with an API key, and reports the outcome", { skip }, async () => {
    const { data: key } = await admin.api.POST("/v1/admin/api-keys", { body: { account: env.account } });
    const logger = quietLogger();
    const outcomes = new OutcomeQueue(service, { logger });
    const gate = new Gate({ client: service, outcomes, logger, units: () => ({ tokens: 50 }) });
    const served: Metering[] = [];
    const app = new Hono();
    app.use("*", hono(gate));
    app.post("/chat", (c) => {
      const m = c.get("metergate");
      served.push(m);
      m.reportUnits({ tokens: 42 });
      return c.json({ event: m.eventId });
    });
    const post = (apiKey: string) => app.request("/chat", { method: "POST", headers: { Authorization: `Bearer ${apiKey}` } });

    const res = await eventually("the API key in admit's policies", async () => {
      const r = await post(key.api_key);
      return r.status === 401 ? undefined : r;
    });
    assert.equal(res.status, 200);
    const { event } = (await res.json()) as { event: string };
    assert.equal(res.headers.get("Metergate-Event-Id"), event);
    assert.match(res.headers.get("RateLimit") ?? "", /r=\d+/);
    assert.equal(served.at(-1)!.admission!.org, env.account);
    assert.equal(await gate.flush(10_000), true);
    assert.equal(outcomes.stats.failed, 0, logger.lines.join("\n"));
    assert.ok(outcomes.stats.reported >= 1);

    const unknown = await post("mgk_" + unique("unknown"));
    assert.equal(unknown.status, 401);
    assert.equal(((await unknown.json()) as { error: { code: string } }).error.code, "unknown_api_key");
  });

  it("answers 429 with admit's RateLimit and Retry-After through the Hono middleware", { skip }, async () => {
    const id = unique("one");
    await admin.api.POST("/v1/admin/accounts", {
      body: { id, kind: "team", parent: env.account, limits: { requests: { limit: 1, window_s: 3600 } } },
    });
    const logger = quietLogger();
    const gate = new Gate({ client: service, logger, outcomes: new OutcomeQueue(service, { logger }), account: () => id });
    const app = new Hono();
    app.use("*", hono(gate));
    app.get("/", (c) => c.text("ok"));
    const first = await eventually("the account in admit's policies", async () => {
      const r = await app.request("/");
      return r.status === 401 ? undefined : r;
    });
    assert.equal(first.status, 200);
    assert.equal(await first.text(), "ok");
    const refused = await app.request("/");
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers.get("Retry-After")) >= 1);
    assert.match(refused.headers.get("RateLimit") ?? "", /r=0/);
    assert.match(refused.headers.get("RateLimit-Policy") ?? "", /q=1;w=3600/);
    const body = (await refused.json()) as { decision: string; blocked_by: { account: string } };
    assert.equal(body.decision, "rate_limited");
    assert.equal(body.blocked_by.account, id);
    await gate.flush(10_000);
  });

  it("is refused with the wrong token", { skip }, async () => {
    const wrong = new Client({ baseUrl: env.url, token: "not-the-token" });
    await assert.rejects(wrong.admit({ account: env.account }), UnauthorizedError);
  });
});
