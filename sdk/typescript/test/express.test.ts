// The Express adapter, on a real Express 5 server: how it renders the Gate's answers into
// res, passes the Metering on and reports on "finish". The behaviours behind it are in
// hono.test.ts.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import expressApp from "express";

import { express, meteringOf, type Metering } from "../src/express.js";
import { eventId, fakeAdmit, until } from "./fake.js";

describe("express middleware", () => {
  let f: ReturnType<typeof fakeAdmit>;
  let base: string;
  let close: () => Promise<void>;
  const served: Metering[] = [];
  const fromReq: (Metering | undefined)[] = [];

  before(async () => {
    const body = { decision: "rate_limited", account: "a", org: "acme", blocked_by: { account: "acme", level: "org", unit: "requests" }, retry_after_ms: 900 };
    // The first request is refused; the others are admitted.
    f = fakeAdmit({
      admit: [{ status: 429, body, headers: { "Retry-After": "1", RateLimit: '"acme-requests";r=0;t=1', "RateLimit-Policy": '"acme-requests";q=10;w=1' } }],
    });
    const app = expressApp();
    app.use(expressApp.json());
    app.use("/v1", express(f.gate, { units: () => ({ tokens: 500 }) }));
    app.post("/v1/chat", (req, res) => {
      const m = res.locals.metergate;
      served.push(m);
      fromReq.push(meteringOf(req));
      m.reportUnits({ tokens: 7 });
      m.reportUnits({ tokens: 5 });
      res.status(200).json({ event: m.eventId, q: (req.body as { q: number }).q });
    });
    app.post("/v1/boom", () => {
      throw new Error("boom");
    });
    app.use((_err: unknown, _req: expressApp.Request, res: expressApp.Response, _next: expressApp.NextFunction) => {
      res.status(500).json({ error: "boom" });
    });
    const server = app.listen(0, "127.0.0.1");
    await new Promise<void>((resolve) => server.once("listening", () => resolve()));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = () => new Promise((resolve) => server.close(() => resolve()));
  });
  after(() => close());

  const post = (path: string, headers: Record<string, string>, body = '{"q":1}') =>
    fetch(base + path, { method: "POST", headers: { "Content-Type": "application/json", ...headers }, body });

  it("answers a refusal with its status, headers and body", async () => {
    const res = await post("/v1/chat", { Authorization: "Bearer mgk_alice" });
    assert.equal(res.status, 429);
    assert.equal(res.headers.get("Retry-After"), "1");
    assert.equal(res.headers.get("RateLimit"), '"acme-requests";r=0;t=1');
    assert.equal(res.headers.get("RateLimit-Policy"), '"acme-requests";q=10;w=1');
    assert.equal(((await res.json()) as { decision: string }).decision, "rate_limited");
    assert.equal(served.length, 0);
    assert.equal((await post("/v1/chat", {})).status, 401);
  });

  it("serves an admitted request with res.locals.metergate and reports its outcome on finish", async () => {
    const res = await post("/v1/chat", { "X-API-Key": "mgk_alice" }, '{"q":3}');
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { event: eventId, q: 3 });
    assert.equal(res.headers.get("Metergate-Event-Id"), eventId);
    assert.equal(res.headers.get("RateLimit"), '"acme-requests";r=299;t=1');
    assert.equal(fromReq.at(-1), served.at(-1));
    await until(() => f.gate.outcomes.stats.reported === 1, "the outcome");
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 200, units: { tokens: 12 } }]);
    assert.deepEqual(f.admits().at(-1)!["units"], { tokens: 500 });
  });

  it("hashes the parsed body into the idempotency key", async () => {
    const h = { Authorization: "Bearer mgk_alice", "Idempotency-Key": "k" };
    await (await post("/v1/chat", h, '{"q":1}')).text();
    await (await post("/v1/chat", h, '{"q":1}')).text();
    await (await post("/v1/chat", h, '{"q":2}')).text();
    const [a, b, c] = f.admits().slice(-3).map((x) => x["idempotency_key"] as string);
    assert.match(a!, /^mw-/);
    assert.equal(a, b);
    assert.notEqual(a, c);
  });

  it("reports a handler's error as its status", async () => {
    const before = f.outcomes().length;
    const res = await post("/v1/boom", { Authorization: "Bearer mgk_alice" });
    assert.equal(res.status, 500);
    await until(() => f.outcomes().length === before + 1, "the outcome");
    assert.equal(f.outcomes().at(-1)!["status"], 500);
  });
});
