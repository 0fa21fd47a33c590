// The TypeScript SDK's client-side overhead: the same admit, timed through the SDK's
// Client.admit and through a raw fetch, interleaved in one process.
//
// bench/sdk.go runs it (make bench BENCH_FLAGS=-only=sdk, docs/bench.md) on the built
// dist (npm run build) and reads the one JSON line it prints: the latency of every timed
// call of the SDK and of the raw call, in ms. The two calls of a pair run in a random
// order; the figures are the bench's, not this script's.
//
// The raw call is what a caller without the SDK writes: a POST /v1/admit with the global
// fetch (keep-alive) with the same body and a fresh idempotency key, its status checked
// and its JSON decoded.

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import { Client } from "../dist/esm/index.js";

const { values: a } = parseArgs({
  options: {
    url: { type: "string" },
    token: { type: "string" },
    account: { type: "string" },
    pairs: { type: "string", default: "1000" },
    warmup: { type: "string", default: "100" },
  },
});
for (const k of ["url", "token", "account"]) {
  if (!a[k]) throw new Error(`--${k} is required`);
}
const pairs = Number(a.pairs);
const warmup = Number(a.warmup);
const units = { requests: 1, tokens: 500 };

const client = new Client({ baseUrl: a.url, token: a.token });
const headers = { Authorization: `Bearer ${a.token}`, "Content-Type": "application/json" };

async function raw() {
  const r = await fetch(`${a.url}/v1/admit`, {
    method: "POST",
    headers,
    body: JSON.stringify({ idempotency_key: randomUUID(), account: a.account, units }),
  });
  if (r.status !== 200) throw new Error(`raw admit: ${r.status} ${(await r.text()).slice(0, 200)}`);
  return r.json();
}

const sdk = () => client.admit({ account: a.account, units });

const out = { sdk_ms: [], raw_ms: [] };
for (let i = 0; i < warmup + pairs; i++) {
  const calls = Math.random() < 0.5 ? [["sdk_ms", sdk], ["raw_ms", raw]] : [["raw_ms", raw], ["sdk_ms", sdk]];
  for (const [name, call] of calls) {
    const begin = process.hrtime.bigint();
    await call();
    const took = Number(process.hrtime.bigint() - begin) / 1e6;
    if (i >= warmup) out[name].push(Math.round(took * 1e4) / 1e4);
  }
}

process.stdout.write(
  JSON.stringify({
    sdk: "typescript",
    version: process.version,
    measures: [{ name: "typescript_client", kind: "client", subject: "Client.admit (@metergate/client)", baseline: "fetch (keep-alive), status checked, JSON decoded", ...out }],
  }) + "\n",
);
