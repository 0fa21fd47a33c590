// The package runs on edge runtimes (Cloudflare Workers, Vercel Edge, Deno, Bun): no module
// of it loads a node: module, and each loads only the packages it is meant to.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { describe, it } from "node:test";

const src = new URL("../../src/", import.meta.url);
// What each module may load at run time, besides its siblings (type-only imports are erased).
const allowed: Record<string, string[]> = { "client.ts": ["openapi-fetch"], "webhooks.ts": ["standardwebhooks"] };

describe("edge", () => {
  for (const file of readdirSync(src).filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))) {
    it(`${file} loads no node: module and no other package`, () => {
      const text = readFileSync(new URL(file, src), "utf8");
      const loaded = [...text.matchAll(/^\s*(?:import|export)\s+(?!type\s)[^;]*?from\s+"([^"]+)"|import\(\s*"([^"]+)"\s*\)/gm)]
        .map((m) => m[1] ?? m[2]!)
        .filter((spec) => !spec.startsWith("./"));
      assert.deepEqual(loaded, allowed[file] ?? []);
    });
  }
});
