import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  Client,
  ForbiddenError,
  InsufficientBalanceError,
  MetergateError,
  PaymentRequiredError,
  QuotaExceededError,
  RateLimitedError,
  UnauthorizedError,
  UnavailableError,
  backoffMs,
  defaultRetry,
  parseRetryAfter,
  type ClientOptions,
} from "../src/index.js";

// A step of a fake admit: a reply, or an error thrown as fetch throws a refused connection.
type Step = { status: number; body: unknown; headers?: Record<string, string> } | Error;

interface Seen {
  method: string;
  url: string;
  authorization: string | null;
  body: Record<string, unknown>;
}

const allowed = {
  decision: "allow",
  event_id: "01J0000000000000000000000A",
  account: "acme-alice",
  org: "acme",
  period: "2026-11",
};

// setup is the test bundle: a client over a fake admit that answers steps in order, and
// records each request and each sleep.
function setup(steps: Step[], opts: Partial<ClientOptions> = {}) {
  const seen: Seen[] = [];
  const sleeps: number[] = [];
  const fetch = async (input: string | Request, init?: RequestInit): Promise<Response> => {
    const req = new Request(input, init);
    seen.push({
      method: req.method,
      url: req.url,
      authorization: req.headers.get("Authorization"),
      body: (await req.clone().json()) as Record<string, unknown>,
    });
    const step = steps.shift();
    if (step === undefined) throw new Error(`unexpected request ${seen.length}`);
    if (step instanceof Error) throw step;
    return new Response(JSON.stringify(step.body), {
      status: step.status,
      headers: { "Content-Type": "application/json", ...step.headers },
    });
  };
  const client = new Client({
    baseUrl: "http://admit.test",
    token: "svc-token",
    fetch,
    sleep: async (ms) => {
      sleeps.push(ms);
    },
    random: () => 0.5,
    ...opts,
  });
  return { client, seen, sleeps, steps };
}

const unavailable = (retryAfter?: string): Step => ({
  status: 503,
  body: { error: { code: "redis_unavailable", message: "Redis is unavailable" } },
  ...(retryAfter === undefined ? {} : { headers: { "Retry-After": retryAfter } }),
});

describe("admit", () => {
  it("sends the request admit's API describes", async () => {
    const { client, seen } = setup([{ status: 200, body: allowed }]);
    const a = await client.admit({ account: "acme-alice", units: { tokens: 1200 }, idempotencyKey: "req-1" });
    assert.equal(seen.length, 1);
    assert.equal(seen[0]!.method, "POST");
    assert.equal(seen[0]!.url, "http://admit.test/v1/admit");
    assert.equal(seen[0]!.authorization, "Bearer svc-token");
    assert.deepEqual(seen[0]!.body, { idempotency_key: "req-1", account: "acme-alice", units: { tokens: 1200 } });
    assert.equal(a.eventId, allowed.event_id);
    assert.equal(a.org, "acme");
    assert.equal(a.replayed, false);
  });

  it("makes an idempotency key per call when none is given", async () => {
    const { client, seen } = setup([
      { status: 200, body: allowed },
      { status: 200, body: allowed },
    ]);
    await client.admit({ apiKey: "mgk_x", units: { tokens: 1 } });
    await client.admit({ apiKey: "mgk_x", units: { tokens: 1 } });
    const [k1, k2] = seen.map((s) => s.body["idempotency_key"]);
    assert.equal(typeof k1, "string");
    assert.ok((k1 as string).length > 0);
    assert.notEqual(k1, k2);
    assert.equal(seen[0]!.body["api_key"], "mgk_x");
    assert.equal(seen[0]!.body["account"], undefined);
  });

  it("retries a 503 with the same idempotency key", async () => {
    const { client, seen, sleeps } = setup([unavailable(), { status: 200, body: { ...allowed, replayed: true } }]);
    const a = await client.admit({ account: "acme-alice", units: { tokens: 10 } });
    assert.equal(seen.length, 2);
    assert.equal(seen[1]!.body["idempotency_key"], seen[0]!.body["idempotency_key"]);
    assert.deepEqual(seen[1]!.body, seen[0]!.body);
    assert.equal(sleeps.length, 1);
    assert.equal(a.replayed, true);
  });

  it("retries a connection error with the same idempotency key", async () => {
    const { client, seen } = setup([new TypeError("fetch failed"), { status: 200, body: allowed }]);
    await client.admit({ account: "acme-alice", units: { tokens: 10 } });
    assert.equal(seen.length, 2);
    assert.equal(seen[1]!.body["idempotency_key"], seen[0]!.body["idempotency_key"]);
  });

  it("retries a try that times out, with the same idempotency key", async () => {
    const keys: unknown[] = [];
    let tries = 0;
    const client = new Client({
      baseUrl: "http://admit.test",
      token: "t",
      timeoutMs: 20,
      sleep: async () => {},
      fetch: async (input, init) => {
        const req = new Request(input, init);
        keys.push(((await req.clone().json()) as Record<string, unknown>)["idempotency_key"]);
        if (++tries === 1) {
          // Hang until the client's per-try timeout aborts the request.
          return new Promise((_, reject) => req.signal.addEventListener("abort", () => reject(req.signal.reason)));
        }
        return Response.json(allowed);
      },
    });
    await client.admit({ account: "acme-alice" });
    assert.equal(tries, 2);
    assert.equal(keys[1], keys[0]);
  });

  it("throws the timeout once every try has timed out", async () => {
    let tries = 0;
    const client = new Client({
      baseUrl: "http://admit.test",
      token: "t",
      timeoutMs: 10,
      retry: { attempts: 2 },
      sleep: async () => {},
      fetch: async (_input, init) => {
        tries++;
        const signal = init!.signal!;
        return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
      },
    });
    await assert.rejects(client.admit({ account: "acme-alice" }), (e: unknown) => {
      assert.ok(e instanceof DOMException, `got ${String(e)}`);
      assert.equal(e.name, "TimeoutError");
      return true;
    });
    assert.equal(tries, 2);
  });

  it("ends on the caller's signal, without a retry", async () => {
    let tries = 0;
    const caller = new AbortController();
    const client = new Client({
      baseUrl: "http://admit.test",
      token: "t",
      sleep: async () => {},
      fetch: async (_input, init) => {
        tries++;
        const signal = init!.signal!;
        setImmediate(() => caller.abort(new Error("hung up")));
        return new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
      },
    });
    await assert.rejects(client.admit({ account: "acme-alice", signal: caller.signal }), /hung up/);
    assert.equal(tries, 1);
  });

  it("leaves no timer behind once the reply is read", async () => {
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
    const { client } = setup([unavailable(), { status: 200, body: allowed }, { status: 202, body: {} }]);
    const before = timers();
    await client.admit({ account: "acme-alice" });
    await client.outcome({ eventId: allowed.event_id, status: 200 });
    assert.equal(timers(), before);
  });

  it("calls fetch with the URL and an init, the headers made once", async () => {
    const inits: [unknown, RequestInit | undefined][] = [];
    const client = new Client({
      baseUrl: "http://admit.test/",
      token: "svc-token",
      fetch: async (input, init) => {
        inits.push([input, init]);
        return Response.json(allowed);
      },
    });
    await client.admit({ account: "acme-alice" });
    await client.admit({ account: "acme-alice" });
    assert.equal(inits[0]![0], "http://admit.test/v1/admit");
    assert.equal(inits[0]![1]!.method, "POST");
    assert.deepEqual(inits[0]![1]!.headers, { Authorization: "Bearer svc-token", "Content-Type": "application/json" });
    assert.equal(inits[1]![1]!.headers, inits[0]![1]!.headers);
    assert.equal(typeof inits[0]![1]!.body, "string");
  });

  it("waits Retry-After before a retry", async () => {
    const { client, sleeps } = setup([unavailable("3"), { status: 200, body: allowed }]);
    await client.admit({ account: "acme-alice", units: { tokens: 10 } });
    assert.deepEqual(sleeps, [3000]);
  });

  it("backs off exponentially with jitter without Retry-After", async () => {
    const { client, sleeps } = setup([unavailable(), unavailable(), unavailable(), { status: 200, body: allowed }]);
    await client.admit({ account: "acme-alice", units: { tokens: 10 } });
    // random() is 0.5: half of 50, 100, 200 ms.
    assert.deepEqual(sleeps, [25, 50, 100]);
  });

  it("gives up after the attempts with UnavailableError", async () => {
    const { client, seen } = setup([unavailable(), unavailable()], { retry: { attempts: 2 } });
    await assert.rejects(client.admit({ account: "acme-alice" }), (e: unknown) => {
      assert.ok(e instanceof UnavailableError);
      assert.equal(e.status, 503);
      assert.equal(e.code, "redis_unavailable");
      return true;
    });
    assert.equal(seen.length, 2);
  });

  it("rethrows a connection error once the attempts are spent", async () => {
    const { client, seen } = setup([new TypeError("fetch failed"), new TypeError("fetch failed")], { retry: { attempts: 2 } });
    await assert.rejects(client.admit({ account: "acme-alice" }), TypeError);
    assert.equal(seen.length, 2);
  });

  it("throws RateLimitedError on 429, with retryAfter and the body, without retrying", async () => {
    const body = {
      decision: "rate_limited",
      account: "acme-alice",
      org: "acme",
      blocked_by: { account: "acme", level: "org", limit: "rpm" },
      retry_after_ms: 1500,
    };
    const { client, seen } = setup([{ status: 429, body, headers: { "Retry-After": "2" } }]);
    await assert.rejects(client.admit({ account: "acme-alice" }), (e: unknown) => {
      assert.ok(e instanceof RateLimitedError);
      assert.ok(e instanceof MetergateError);
      assert.equal(e.status, 429);
      assert.equal(e.code, "rate_limited");
      assert.equal(e.retryAfter, 2);
      assert.deepEqual(e.body, body);
      return true;
    });
    assert.equal(seen.length, 1);
  });

  it("throws RateLimitedError without retryAfter when the request can never pass", async () => {
    const body = { decision: "rate_limited", account: "a", org: "o", blocked_by: {}, retry_after_ms: -1 };
    const { client } = setup([{ status: 429, body }]);
    await assert.rejects(client.admit({ account: "a" }), (e: unknown) => {
      assert.ok(e instanceof RateLimitedError);
      assert.equal(e.retryAfter, undefined);
      return true;
    });
  });

  const cases: { name: string; status: number; body: unknown; type: new (...a: never[]) => MetergateError; code: string }[] = [
    {
      name: "402 quota_exceeded",
      status: 402,
      body: { decision: "quota_exceeded", account: "a", org: "o", blocked_by: {}, period: "2026-11" },
      type: QuotaExceededError,
      code: "quota_exceeded",
    },
    {
      name: "402 insufficient_balance",
      status: 402,
      body: { decision: "insufficient_balance", account: "a", org: "o", blocked_by: {}, balance: 0 },
      type: InsufficientBalanceError,
      code: "insufficient_balance",
    },
    {
      name: "401",
      status: 401,
      body: { error: { code: "unknown_api_key", message: "unknown API key" } },
      type: UnauthorizedError,
      code: "unknown_api_key",
    },
    {
      name: "403",
      status: 403,
      body: { error: { code: "forbidden", message: "revoked" } },
      type: ForbiddenError,
      code: "forbidden",
    },
    {
      name: "422",
      status: 422,
      body: { error: { code: "idempotency_key_reused", message: "other units" } },
      type: MetergateError,
      code: "idempotency_key_reused",
    },
  ];
  for (const c of cases) {
    it(`throws ${c.type.name} on ${c.name}, without retrying`, async () => {
      const { client, seen } = setup([{ status: c.status, body: c.body }]);
      await assert.rejects(client.admit({ account: "a" }), (e: unknown) => {
        assert.ok(e instanceof c.type, `got ${String(e)}`);
        assert.equal((e as MetergateError).status, c.status);
        assert.equal((e as MetergateError).code, c.code);
        assert.deepEqual((e as MetergateError).body, c.body);
        return true;
      });
      assert.equal(seen.length, 1);
    });
  }

  it("counts a 402 as PaymentRequiredError", async () => {
    const { client } = setup([{ status: 402, body: { decision: "quota_exceeded" } }]);
    await assert.rejects(client.admit({ account: "a" }), PaymentRequiredError);
  });

  it("refuses both account and apiKey", async () => {
    const { client, seen } = setup([]);
    // @ts-expect-error: the types allow one of them only.
    await assert.rejects(client.admit({ account: "a", apiKey: "k" }), TypeError);
    assert.equal(seen.length, 0);
  });
});

describe("outcome", () => {
  it("posts the outcome and retries a 503", async () => {
    const reply = { status: "accepted", event_id: allowed.event_id };
    const { client, seen } = setup([unavailable("1"), { status: 202, body: reply }]);
    const r = await client.outcome({ eventId: allowed.event_id, status: 200, units: { tokens: 1170 } });
    assert.deepEqual(r, reply);
    assert.equal(seen.length, 2);
    assert.equal(seen[0]!.url, "http://admit.test/v1/outcomes");
    assert.deepEqual(seen[0]!.body, { event_id: allowed.event_id, status: 200, units: { tokens: 1170 } });
  });
});

describe("backoff", () => {
  it("caps the backoff and Retry-After", () => {
    assert.equal(backoffMs(defaultRetry, 20, undefined, () => 0.999), 0.999 * defaultRetry.capMs);
    assert.equal(backoffMs(defaultRetry, 1, 3600, () => 0), defaultRetry.capMs * 4);
  });

  it("reads Retry-After as seconds or an HTTP date", () => {
    assert.equal(parseRetryAfter("2"), 2);
    assert.equal(parseRetryAfter(null), undefined);
    assert.equal(parseRetryAfter("soon"), undefined);
    const now = Date.parse("2026-11-27T20:00:00Z");
    assert.equal(parseRetryAfter("Fri, 27 Nov 2026 20:00:05 GMT", now), 5);
  });
});
