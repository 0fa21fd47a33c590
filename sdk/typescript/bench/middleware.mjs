// What the SDK's middleware adds to an app's request: the same app asked for its route
// behind the middleware and for its route the middleware skips, interleaved with a raw
// admit of the same kind (POST /v1/admit with fetch, the caller's API key, the same units):
// the middleware's call without the middleware.
//
// - typescript_hono: a Hono app, asked in this process through app.fetch (no server
//   adapter: @hono/node-server is not one of the package's dependencies; an adapter would
//   add the same to both routes).
// - typescript_express: an Express app on node:http in a process of its own (this script,
//   "serve"), asked over keep-alive HTTP with fetch.
//
// bench/sdk.go runs it (make bench BENCH_FLAGS=-only=sdk, docs/bench.md) on the built dist
// (npm run build) and reads the one JSON line it prints: the latency of every timed request
// of each route and of the raw admit, in ms. The three calls of a round run in a random
// order; the figures are the bench's. The metered routes are admitted with the caller's
// API key (its Authorization header, the middleware's default) and one request and 500
// tokens; their outcomes are reported in the background after the reply, as in any app.

import { fork } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { parseArgs } from "node:util";
import express from "express";
import { Hono } from "hono";
import { Client, Gate } from "../dist/esm/index.js";
import { hono } from "../dist/esm/hono.js";
import { express as metergateExpress } from "../dist/esm/express.js";

const { values: a, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    url: { type: "string" },
    token: { type: "string" },
    "api-key": { type: "string" },
    pairs: { type: "string", default: "1000" },
    warmup: { type: "string", default: "100" },
  },
});
for (const k of ["url", "token"]) {
  if (!a[k]) throw new Error(`--${k} is required`);
}
const units = { requests: 1, tokens: 500 };
const skip = (req) => new URL(req.url).pathname === "/plain";
const gate = () => new Gate({ client: new Client({ baseUrl: a.url, token: a.token }), units: () => units, skip });

if (positionals[0] === "serve") {
  const app = express();
  app.use(metergateExpress(gate()));
  const hello = (_req, res) => res.json({ hello: "world" });
  app.get("/metered", hello);
  app.get("/plain", hello);
  const server = app.listen(0, "127.0.0.1", () => process.send({ port: server.address().port }));
  process.on("disconnect", () => server.close(() => process.exit(0)));
} else {
  if (!a["api-key"]) throw new Error("--api-key is required");
  const auth = { Authorization: `Bearer ${a["api-key"]}` };
  const admitHeaders = { Authorization: `Bearer ${a.token}`, "Content-Type": "application/json" };
  async function check(name, r) {
    if (r.status !== 200) throw new Error(`${name}: ${r.status} ${(await r.text()).slice(0, 200)}`);
    return r.json();
  }
  const admit = async () =>
    check(
      "admit",
      await fetch(`${a.url}/v1/admit`, {
        method: "POST",
        headers: admitHeaders,
        body: JSON.stringify({ idempotency_key: randomUUID(), api_key: a["api-key"], units }),
      }),
    );

  async function timed(get) {
    const calls = { metered: () => get("metered"), plain: () => get("plain"), admit };
    const out = { metered: [], plain: [], admit: [] };
    const n = Number(a.warmup) + Number(a.pairs);
    for (let i = 0; i < n; i++) {
      const names = Object.keys(calls).sort(() => Math.random() - 0.5);
      for (const name of names) {
        const begin = process.hrtime.bigint();
        await calls[name]();
        const took = Number(process.hrtime.bigint() - begin) / 1e6;
        if (i >= Number(a.warmup)) out[name].push(Math.round(took * 1e4) / 1e4);
      }
    }
    return out;
  }
  const measure = (name, subject, baseline, s) => ({ name, kind: "middleware", subject, baseline, sdk_ms: s.metered, raw_ms: s.plain, admit_ms: s.admit });

  const app = new Hono();
  app.use("*", hono(gate()));
  app.get("/metered", (c) => c.json({ hello: "world" }));
  app.get("/plain", (c) => c.json({ hello: "world" }));
  const honoSamples = await timed(async (route) => check(route, await app.fetch(new Request(`http://app/${route}`, { headers: auth }))));

  const server = fork(new URL(import.meta.url).pathname, ["serve", ...process.argv.slice(2)], { stdio: ["ignore", "ignore", "inherit", "ipc"] });
  const [{ port }] = await once(server, "message");
  let expressSamples;
  try {
    expressSamples = await timed(async (route) => check(route, await fetch(`http://127.0.0.1:${port}/${route}`, { headers: auth })));
  } finally {
    server.disconnect();
  }
  await once(server, "exit");

  process.stdout.write(
    JSON.stringify({
      sdk: "typescript",
      version: process.version,
      measures: [
        measure("typescript_hono", "a Hono route behind the SDK's hono middleware (app.fetch, in process)", "the same app's route the middleware skips", honoSamples),
        measure("typescript_express", "an Express route behind the SDK's express middleware (node:http)", "the same app's route the middleware skips", expressSamples),
      ],
    }) + "\n",
  );
  process.exit(0); // the hono gate's outcome queue holds no more than its last reports
}
