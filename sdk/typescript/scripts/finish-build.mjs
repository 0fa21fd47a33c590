// After tsc: mark each build's module format (the package itself is "type": "module") and
// copy the generated types, which tsc does not emit (src/schema.d.ts is a declaration file).
import { copyFileSync, writeFileSync } from "node:fs";

for (const [dir, type] of [["dist/esm", "module"], ["dist/cjs", "commonjs"]]) {
  writeFileSync(`${dir}/package.json`, JSON.stringify({ type }) + "\n");
  copyFileSync("src/schema.d.ts", `${dir}/schema.d.ts`);
}
