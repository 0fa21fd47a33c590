// Builds dist/esm and dist/cjs, marks each build's module format (the package itself is
// "type": "module") and copies the generated types, which tsc does not emit (src/schema.d.ts
// is a declaration file). The build is made in a directory of its own and then put in place
// by renames, so a process loading dist (examples/hono, built before it starts) never sees a
// half-written or missing one while another build runs beside it.
import { execFileSync } from "node:child_process";
import { copyFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

const tsc = join(dirname(createRequire(import.meta.url).resolve("typescript/package.json")), "bin", "tsc");
const tmp = `dist.${process.pid}.tmp`;
rmSync(tmp, { recursive: true, force: true });
try {
  for (const [format, type] of [["esm", "module"], ["cjs", "commonjs"]]) {
    execFileSync(process.execPath, [tsc, "-p", `tsconfig.${format}.json`, "--outDir", `${tmp}/${format}`], { stdio: "inherit" });
    writeFileSync(`${tmp}/${format}/package.json`, JSON.stringify({ type }) + "\n");
    copyFileSync("src/schema.d.ts", `${tmp}/${format}/schema.d.ts`);
  }
  const old = `dist.${process.pid}.old`;
  for (let n = 0; ; n++) {
    try {
      renameSync("dist", old);
    } catch (e) {
      if (e.code !== "ENOENT") throw e;
    }
    try {
      renameSync(tmp, "dist");
      break;
    } catch (e) {
      // Another build put its dist in place between the two renames: take it out again.
      if (n >= 10 || (e.code !== "ENOTEMPTY" && e.code !== "EEXIST")) throw e;
      rmSync(old, { recursive: true, force: true });
    }
  }
  rmSync(old, { recursive: true, force: true });
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
