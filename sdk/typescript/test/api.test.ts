// Every operation of the OpenAPI document is callable through client.api, typed from the
// generated schema: `calls` below must have one typed call per path and method of `paths`
// (tsc refuses a missing or an unknown one), and the test checks that the document lists
// exactly those operations and that each call reaches its route.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { parse } from "yaml";

import { Client, ForbiddenError, MetergateError, UnavailableError, type Api, type Method, type paths } from "../src/index.js";

/** "GET /v1/admin/accounts/{id}" for every operation of the generated types. */
type Operation = {
  [P in keyof paths]: { [M in Method]: paths[P][M] extends undefined ? never : `${Uppercase<M>} ${P & string}` }[Method];
}[keyof paths];

// A request body of whatever type the call expects. Bodies are the generated types' business
// (the tests of the client and against admit send real ones); here only the route matters.
const body = <T,>(): NonNullable<T> => ({}) as NonNullable<T>;

const calls: { [O in Operation]: (api: Api) => Promise<unknown> } = {
  "POST /v1/admit": (api) => api.POST("/v1/admit", { body: body() }),
  "POST /v1/estimate": (api) => api.POST("/v1/estimate", { body: body() }),
  "POST /v1/outcomes": (api) => api.POST("/v1/outcomes", { body: body() }),
  "GET /v1/check": (api) => api.GET("/v1/check"),
  "PUT /v1/check": (api) => api.PUT("/v1/check"),
  "POST /v1/check": (api) => api.POST("/v1/check"),
  "DELETE /v1/check": (api) => api.DELETE("/v1/check"),
  "OPTIONS /v1/check": (api) => api.OPTIONS("/v1/check"),
  "HEAD /v1/check": (api) => api.HEAD("/v1/check"),
  "PATCH /v1/check": (api) => api.PATCH("/v1/check"),
  "GET /v1/check/{path}": (api) => api.GET("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "PUT /v1/check/{path}": (api) => api.PUT("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "POST /v1/check/{path}": (api) => api.POST("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "DELETE /v1/check/{path}": (api) => api.DELETE("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "OPTIONS /v1/check/{path}": (api) => api.OPTIONS("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "HEAD /v1/check/{path}": (api) => api.HEAD("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "PATCH /v1/check/{path}": (api) => api.PATCH("/v1/check/{path}", { params: { path: { path: "x" } } }),
  "GET /v1/usage/{account}": (api) => api.GET("/v1/usage/{account}", { params: { path: { account: "x" } } }),
  "GET /v1/balance/{account}": (api) => api.GET("/v1/balance/{account}", { params: { path: { account: "x" } } }),
  "POST /v1/admin/accounts": (api) => api.POST("/v1/admin/accounts", { body: body() }),
  "GET /v1/admin/accounts/{id}": (api) => api.GET("/v1/admin/accounts/{id}", { params: { path: { id: "x" } } }),
  "PUT /v1/admin/accounts/{id}": (api) => api.PUT("/v1/admin/accounts/{id}", { params: { path: { id: "x" } }, body: body() }),
  "POST /v1/admin/accounts/{id}/grants": (api) => api.POST("/v1/admin/accounts/{id}/grants", { params: { path: { id: "x" } }, body: body() }),
  "DELETE /v1/admin/accounts/{id}/grants/{grant}": (api) => api.DELETE("/v1/admin/accounts/{id}/grants/{grant}", { params: { path: { id: "x", grant: "x" } } }),
  "GET /v1/admin/alerts": (api) => api.GET("/v1/admin/alerts"),
  "POST /v1/admin/alerts": (api) => api.POST("/v1/admin/alerts", { body: body() }),
  "GET /v1/admin/alerts/{id}": (api) => api.GET("/v1/admin/alerts/{id}", { params: { path: { id: "x" } } }),
  "PUT /v1/admin/alerts/{id}": (api) => api.PUT("/v1/admin/alerts/{id}", { params: { path: { id: "x" } }, body: body() }),
  "DELETE /v1/admin/alerts/{id}": (api) => api.DELETE("/v1/admin/alerts/{id}", { params: { path: { id: "x" } } }),
  "POST /v1/admin/api-keys": (api) => api.POST("/v1/admin/api-keys", { body: body() }),
  "DELETE /v1/admin/api-keys/{id}": (api) => api.DELETE("/v1/admin/api-keys/{id}", { params: { path: { id: "x" } } }),
  "GET /v1/admin/plans": (api) => api.GET("/v1/admin/plans"),
  "POST /v1/admin/plans": (api) => api.POST("/v1/admin/plans", { body: body() }),
  "GET /v1/admin/plans/{id}": (api) => api.GET("/v1/admin/plans/{id}", { params: { path: { id: "x" } } }),
  "PUT /v1/admin/plans/{id}": (api) => api.PUT("/v1/admin/plans/{id}", { params: { path: { id: "x" } }, body: body() }),
  "GET /v1/admin/webhooks": (api) => api.GET("/v1/admin/webhooks"),
  "POST /v1/admin/webhooks": (api) => api.POST("/v1/admin/webhooks", { body: body() }),
  "GET /v1/admin/webhooks/{id}": (api) => api.GET("/v1/admin/webhooks/{id}", { params: { path: { id: "x" } } }),
  "PUT /v1/admin/webhooks/{id}": (api) => api.PUT("/v1/admin/webhooks/{id}", { params: { path: { id: "x" } }, body: body() }),
  "DELETE /v1/admin/webhooks/{id}": (api) => api.DELETE("/v1/admin/webhooks/{id}", { params: { path: { id: "x" } } }),
  "POST /v1/admin/webhooks/{id}/rotate": (api) => api.POST("/v1/admin/webhooks/{id}/rotate", { params: { path: { id: "x" } } }),
  "GET /v1/admin/webhooks/{id}/deliveries": (api) => api.GET("/v1/admin/webhooks/{id}/deliveries", { params: { path: { id: "x" } } }),
  "GET /v1/admin/webhooks/{id}/deliveries/{delivery}": (api) => api.GET("/v1/admin/webhooks/{id}/deliveries/{delivery}", { params: { path: { id: "x", delivery: 1 } } }),
  "POST /v1/admin/webhooks/{id}/deliveries/{delivery}/replay": (api) => api.POST("/v1/admin/webhooks/{id}/deliveries/{delivery}/replay", { params: { path: { id: "x", delivery: 1 } } }),
  "POST /v1/admin/webhooks/{id}/replay": (api) => api.POST("/v1/admin/webhooks/{id}/replay", { params: { path: { id: "x" } }, body: body() }),
  "GET /v1/admin/invoices": (api) => api.GET("/v1/admin/invoices"),
  "GET /v1/admin/invoices/{id}": (api) => api.GET("/v1/admin/invoices/{id}", { params: { path: { id: "x" } } }),
  "POST /v1/admin/invoices/{id}/status": (api) => api.POST("/v1/admin/invoices/{id}/status", { params: { path: { id: "x" } }, body: body() }),
  "POST /v1/admin/invoices/{id}/void": (api) => api.POST("/v1/admin/invoices/{id}/void", { params: { path: { id: "x" } }, body: body() }),
  "POST /v1/admin/invoices/{id}/reissue": (api) => api.POST("/v1/admin/invoices/{id}/reissue", { params: { path: { id: "x" } }, body: body() }),
  "GET /v1/admin/credit-notes": (api) => api.GET("/v1/admin/credit-notes"),
  "GET /v1/admin/credit-notes/{id}": (api) => api.GET("/v1/admin/credit-notes/{id}", { params: { path: { id: "x" } } }),
  "POST /v1/admin/amendments": (api) => api.POST("/v1/admin/amendments", { body: body() }),
  "GET /v1/admin/accounts/{id}/billing": (api) => api.GET("/v1/admin/accounts/{id}/billing", { params: { path: { id: "x" } } }),
  "PUT /v1/admin/accounts/{id}/billing": (api) => api.PUT("/v1/admin/accounts/{id}/billing", { params: { path: { id: "x" } }, body: body() }),
  "GET /v1/admin/staff": (api) => api.GET("/v1/admin/staff"),
  "POST /v1/admin/staff": (api) => api.POST("/v1/admin/staff", { body: body() }),
  "DELETE /v1/admin/staff/{id}": (api) => api.DELETE("/v1/admin/staff/{id}", { params: { path: { id: "x" } } }),
  "GET /v1/admin/audit": (api) => api.GET("/v1/admin/audit"),
  "GET /v1/admin/customer-tokens": (api) => api.GET("/v1/admin/customer-tokens"),
  "POST /v1/admin/customer-tokens": (api) => api.POST("/v1/admin/customer-tokens", { body: body() }),
  "GET /v1/portal/me": (api) => api.GET("/v1/portal/me"),
  "GET /v1/portal/accounts/{id}": (api) => api.GET("/v1/portal/accounts/{id}", { params: { path: { id: "x" } } }),
  "PUT /v1/portal/accounts/{id}": (api) => api.PUT("/v1/portal/accounts/{id}", { params: { path: { id: "x" } }, body: body() }),
  "POST /v1/portal/accounts": (api) => api.POST("/v1/portal/accounts", { body: body() }),
  "GET /v1/portal/accounts/{id}/children": (api) => api.GET("/v1/portal/accounts/{id}/children", { params: { path: { id: "x" } } }),
  "GET /v1/portal/accounts/{id}/usage": (api) => api.GET("/v1/portal/accounts/{id}/usage", { params: { path: { id: "x" } } }),
  "GET /v1/portal/accounts/{id}/api-keys": (api) => api.GET("/v1/portal/accounts/{id}/api-keys", { params: { path: { id: "x" } } }),
  "POST /v1/portal/accounts/{id}/api-keys": (api) => api.POST("/v1/portal/accounts/{id}/api-keys", { params: { path: { id: "x" } } }),
  "DELETE /v1/portal/api-keys/{id}": (api) => api.DELETE("/v1/portal/api-keys/{id}", { params: { path: { id: "x" } } }),
  "GET /v1/portal/accounts/{id}/balance": (api) => api.GET("/v1/portal/accounts/{id}/balance", { params: { path: { id: "x" } } }),
  "GET /v1/portal/invoices": (api) => api.GET("/v1/portal/invoices"),
  "GET /v1/portal/invoices/{id}": (api) => api.GET("/v1/portal/invoices/{id}", { params: { path: { id: "x" } } }),
  "GET /v1/portal/credit-notes": (api) => api.GET("/v1/portal/credit-notes"),
  "GET /v1/portal/credit-notes/{id}": (api) => api.GET("/v1/portal/credit-notes/{id}", { params: { path: { id: "x" } } }),
  "GET /v1/admin/customer-tokens/{id}": (api) => api.GET("/v1/admin/customer-tokens/{id}", { params: { path: { id: "x" } } }),
  "DELETE /v1/admin/customer-tokens/{id}": (api) => api.DELETE("/v1/admin/customer-tokens/{id}", { params: { path: { id: "x" } } }),
  "POST /v1/admin/portal-sessions": (api) => api.POST("/v1/admin/portal-sessions", { body: body() }),
  "GET /openapi.yaml": (api) => api.GET("/openapi.yaml"),
};

const document = parse(readFileSync(new URL("../../../../internal/api/openapi.yaml", import.meta.url), "utf8")) as {
  paths: Record<string, Record<string, unknown>>;
};
const methods = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

interface Seen {
  method: string;
  path: string;
  authorization: string | null;
}

function setup(reply: () => Response = () => Response.json({})) {
  const seen: Seen[] = [];
  const client = new Client({
    baseUrl: "http://admit.test",
    token: "admin-token",
    sleep: async () => {},
    fetch: async (input, init) => {
      const req = new Request(input, init);
      seen.push({ method: req.method, path: new URL(req.url).pathname, authorization: req.headers.get("Authorization") });
      return reply();
    },
  });
  return { client, seen };
}

describe("api", () => {
  it("has a typed call for every operation of the document", () => {
    const documented = Object.entries(document.paths).flatMap(([path, item]) =>
      methods.filter((m) => item[m] !== undefined).map((m) => `${m.toUpperCase()} ${path}`),
    );
    assert.deepEqual(Object.keys(calls).sort(), documented.sort());
  });

  for (const [operation, call] of Object.entries(calls)) {
    it(`reaches ${operation}`, async () => {
      const { client, seen } = setup();
      await call(client.api);
      const [method, template] = operation.split(" ") as [string, string];
      assert.equal(seen.length, 1);
      assert.equal(seen[0]!.method, method);
      assert.match(seen[0]!.path, new RegExp(`^${template.replace(/\{[^}]+\}/g, "[^/]+")}$`));
      assert.equal(seen[0]!.authorization, "Bearer admin-token");
    });
  }

  it("fills path parameters and queries", async () => {
    const { client, seen } = setup(() => Response.json({ data: [] }));
    await client.api.GET("/v1/admin/webhooks/{id}/deliveries", {
      params: { path: { id: "wh 1" }, query: { status: "failed", limit: 5 } },
    });
    assert.equal(seen[0]!.path, "/v1/admin/webhooks/wh%201/deliveries");
  });

  it("throws the typed error of an error status", async () => {
    const { client } = setup(() => Response.json({ error: { code: "forbidden", message: "the service token" } }, { status: 403 }));
    await assert.rejects(client.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: "acme" } } }), (e: unknown) => {
      assert.ok(e instanceof ForbiddenError);
      assert.equal(e.code, "forbidden");
      return true;
    });
    const notFound = setup(() => Response.json({ error: { code: "not_found", message: "no such account" } }, { status: 404 }));
    await assert.rejects(notFound.client.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: "x" } } }), (e: unknown) => {
      assert.ok(e instanceof MetergateError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      return true;
    });
  });

  it("retries a 503 of an idempotent method, never of a POST", async () => {
    const unavailable = () => Response.json({ error: { code: "unavailable", message: "PostgreSQL" } }, { status: 503 });
    const get = setup(unavailable);
    await assert.rejects(get.client.api.GET("/v1/admin/plans"), UnavailableError);
    assert.equal(get.seen.length, 4);
    const post = setup(unavailable);
    await assert.rejects(post.client.api.POST("/v1/admin/api-keys", { body: { account: "acme" } }), UnavailableError);
    assert.equal(post.seen.length, 1);
  });

  it("passes fields and enum values the document does not know yet", async () => {
    const plan = { id: "pro", rank: 1, limits: {}, created_at: "2026-11-01T00:00:00Z", tier: "gold", algorithm: "leaky_bucket" };
    const { client } = setup(() => Response.json(plan));
    const { data } = await client.api.GET("/v1/admin/plans/{id}", { params: { path: { id: "pro" } } });
    assert.deepEqual(data, plan);
  });
});
