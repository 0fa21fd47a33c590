// Generates src/schema.d.ts from an OpenAPI document with openapi-typescript's own CLI.
//
//   node scripts/generate.mjs [document]          write src/schema.d.ts
//   node scripts/generate.mjs --check [document]  fail if src/schema.d.ts differs from it
//
// The document is a file or a URL: the argument, else $METERGATE_OPENAPI, else the repository's
// internal/api/openapi.yaml. CI checks the types against the document admit serves:
// `npm run generate:check -- http://127.0.0.1:8080/openapi.yaml`.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

const args = process.argv.slice(2);
const check = args.includes("--check");
const source = args.find((a) => a !== "--check") ?? process.env.METERGATE_OPENAPI ?? "../../internal/api/openapi.yaml";
const target = "src/schema.d.ts";
const cli = join(dirname(createRequire(import.meta.url).resolve("openapi-typescript/package.json")), "bin/cli.js");

const dir = check ? mkdtempSync(join(tmpdir(), "metergate-schema-")) : undefined;
const out = dir ? join(dir, "schema.d.ts") : target;
try {
  const run = spawnSync(process.execPath, [cli, source, "-o", out], { stdio: "inherit" });
  if (run.status !== 0) process.exit(run.status ?? 1);
  if (check) {
    if (readFileSync(out, "utf8") !== readFileSync(target, "utf8")) {
      console.error(`${target} is not what ${source} generates: run \`npm run generate -- ${source}\` and commit it`);
      process.exitCode = 1;
    } else {
      console.log(`${target} is in step with ${source}`);
    }
  }
} finally {
  if (dir) rmSync(dir, { recursive: true, force: true });
}
