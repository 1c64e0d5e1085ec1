import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { codeCacheKey, readCodeCache } from "../src/code-cache.js";

// What sandboxes run: the bundle and the cache the build wrote beside it (`npm run build`).
const BUNDLE = fileURLToPath(new URL("../dist/envd-main.cjs", import.meta.url));
const CACHE = `${BUNDLE}.cache`;
const COMPILER = fileURLToPath(new URL("../dist/code-cache.js", import.meta.url));
const scratch = mkdtempSync(join(tmpdir(), "envd-code-cache-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/**
 * compileModule in a fresh Node.js, as a sandbox's envd runs it: within one process V8 may serve a script it
 * compiled before from memory, without looking at the cache at all.
 */
function compileInFreshNode(file: string, cacheFile: string): { fromCache: boolean; rejected: boolean | null } {
  const program = `import { compileModule } from ${JSON.stringify(COMPILER)};
const { script, fromCache } = compileModule(${JSON.stringify(file)}, ${JSON.stringify(cacheFile)});
process.stdout.write(JSON.stringify({ fromCache, rejected: script.cachedDataRejected ?? null }));`;
  return JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", program], { encoding: "utf8" }));
}

describe("envd's code cache", () => {
  it("the build's cache was made for the bundle and this Node.js, and V8 compiles the bundle from it", () => {
    expect(compileInFreshNode(BUNDLE, CACHE)).toEqual({ fromCache: true, rejected: false });
    const key = codeCacheKey(readFileSync(BUNDLE, "utf8").replace(/^#!.*/, ""));
    expect(readCodeCache(CACHE, key)?.length).toBe(readFileSync(CACHE).length - 32);
  });

  it("ignores a cache made for other text, even of the same length (V8 would take it)", () => {
    const source = readFileSync(BUNDLE, "utf8");
    const other = join(scratch, "other.cjs");
    // One character changed: the length V8 checks stays the same.
    writeFileSync(other, `${source.slice(0, -2)}${source.at(-2) === ";" ? " " : ";"}${source.at(-1)}`);
    expect(readFileSync(other).length).toBe(readFileSync(BUNDLE).length);
    expect(readCodeCache(CACHE, codeCacheKey(readFileSync(other, "utf8").replace(/^#!.*/, "")))).toBeUndefined();
    expect(compileInFreshNode(other, CACHE)).toEqual({ fromCache: false, rejected: null });
  });

  it("compiles as usual when the cache is missing, truncated, or holds data V8 rejects", () => {
    const copy = join(scratch, "envd-main.cjs");
    copyFileSync(BUNDLE, copy);
    expect(compileInFreshNode(copy, join(scratch, "absent.cache"))).toEqual({ fromCache: false, rejected: null });
    const truncated = join(scratch, "truncated.cache");
    writeFileSync(truncated, readFileSync(CACHE).subarray(0, 20));
    expect(compileInFreshNode(copy, truncated)).toEqual({ fromCache: false, rejected: null });
    // The right header over damaged data: V8's own checks refuse it, and the script still compiles.
    const damaged = join(scratch, "damaged.cache");
    const data = Buffer.from(readFileSync(CACHE));
    data.fill(0x5a, 32, 96);
    writeFileSync(damaged, data);
    expect(compileInFreshNode(copy, damaged)).toEqual({ fromCache: false, rejected: true });
  });
});
