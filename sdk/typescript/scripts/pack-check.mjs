// Packs the package as npm would publish it, installs the tarball into a fresh project and
// uses it there: require() of the CommonJS build, import of the ES module build, each entry
// point (., ./express, ./hono, ./webhooks), and tsc --strict over both against its types.
//
//   npm run pack:check
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const sdk = resolve(import.meta.dirname ?? new URL(".", import.meta.url).pathname, "..");
const dir = mkdtempSync(join(tmpdir(), "metergate-pack-"));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const run = (cmd, args, cwd = dir) => execFileSync(cmd, args, { cwd, stdio: ["ignore", "pipe", "inherit"], encoding: "utf8" });

try {
  const [packed] = JSON.parse(run(npm, ["pack", "--json", "--pack-destination", dir], sdk));
  const files = new Set(packed.files.map((f) => f.path));
  const want = ["index", "express", "hono", "webhooks"].flatMap((n) =>
    ["esm", "cjs"].flatMap((f) => [`dist/${f}/${n}.js`, `dist/${f}/${n}.d.ts`]),
  );
  want.push("dist/esm/schema.d.ts", "dist/cjs/schema.d.ts", "dist/esm/package.json", "dist/cjs/package.json", "README.md");
  const missing = want.filter((f) => !files.has(f));
  if (missing.length > 0) throw new Error(`the tarball lacks ${missing.join(", ")}`);
  console.log(`${packed.filename}: ${packed.files.length} files, ${packed.size} bytes`);

  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "pack-check", private: true }));
  run(npm, ["install", "--no-audit", "--no-fund", "--ignore-scripts", join(dir, packed.filename)]);

  const names = {
    ".": ["Client", "Gate", "Metering", "OutcomeQueue", "withMetergate", "meteringOf", "openaiUsage", "trackUsage", "RateLimitedError"],
    "/express": ["express", "Gate"],
    "/hono": ["hono", "Gate"],
    "/webhooks": ["verifyWebhook", "WebhookVerificationError", "webhookTypes"],
  };
  const check = (how) =>
    Object.entries(names)
      .map(([sub, exports]) => {
        const spec = `@metergate/client${sub === "." ? "" : sub}`;
        const load = how === "require" ? `require(${JSON.stringify(spec)})` : `await import(${JSON.stringify(spec)})`;
        return `{ const m = ${load}; for (const n of ${JSON.stringify(exports)}) if (m[n] === undefined) throw new Error(${JSON.stringify(spec)} + " has no " + n); }`;
      })
      .join("\n");
  const use = `const c = new Client({ baseUrl: "http://127.0.0.1:1", token: "t" });
if (typeof c.api.GET !== "function") throw new Error("no client.api");`;
  writeFileSync(join(dir, "check.cjs"), `${check("require")}\nconst { Client } = require("@metergate/client");\n${use}\nconsole.log("require: ok");\n`);
  writeFileSync(join(dir, "check.mjs"), `${check("import")}\nimport { Client } from "@metergate/client";\n${use}\nconsole.log("import: ok");\n`);
  process.stdout.write(run(process.execPath, ["check.cjs"]));
  process.stdout.write(run(process.execPath, ["check.mjs"]));

  // The types, as a consumer's tsc resolves them through "exports" for each module format.
  const typed = `import { Client, Gate, withMetergate, type Units } from "@metergate/client";
import { express } from "@metergate/client/express";
import { verifyWebhook } from "@metergate/client/webhooks";
const client = new Client({ baseUrl: "http://127.0.0.1:8080", token: "t" });
export async function f(): Promise<string> {
  const { data } = await client.api.GET("/v1/admin/accounts/{id}", { params: { path: { id: "acme" } } });
  const units: Units = { tokens: 1 };
  const gate = new Gate({ client });
  void express(gate); void withMetergate(() => new Response(), gate); void verifyWebhook; void units;
  return data.id;
}
`;
  writeFileSync(join(dir, "typed.mts"), typed);
  writeFileSync(join(dir, "typed.cts"), typed);
  const tsc = join(sdk, "node_modules", "typescript", "bin", "tsc");
  run(process.execPath, [tsc, "--noEmit", "--strict", "--skipLibCheck", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--lib", "es2022,dom", "typed.mts", "typed.cts"]);
  console.log("types (import and require): ok");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
