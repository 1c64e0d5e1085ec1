/**
 * envd's entry point in sandboxes, bundled on its own to `dist/envd.cjs`: runs envd's bundle (`dist/envd-main.cjs`)
 * from the V8 code cache `scripts/code-cache.mjs` wrote beside it at build time, so a start does not compile the
 * bundle again, nor the functions a first command runs (envd's start and warm-up: 10–13 ms less CPU here).
 *
 * The cache is used only when its header matches the bundle's contents and this Node.js (V8 checks only the
 * source's length itself); any other cache, or none, and the bundle compiles as usual. Sandboxes cannot write it:
 * the host made it, and envd's directory is bound read-only.
 *
 * With ENVD_CODE_CACHE_OUT set (the build's code-cache step only), the cache is written there when the process
 * exits, holding every function compiled until then.
 */
import { createHash } from "node:crypto";
import { readFileSync, renameSync, writeFileSync } from "node:fs";
import Module, { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import vm from "node:vm";

const MAIN = "envd-main.cjs";
const HEADER_BYTES = 32;

/** What a cache was made for: the bundle's text and the Node.js (V8) that compiled it. */
function cacheKey(source: string): Buffer {
  return createHash("sha256").update(`${process.version}\0${process.arch}\0`).update(source).digest();
}

/** The V8 data of the cache file, when it was made for exactly this bundle and Node.js. */
function readCache(file: string, key: Buffer): Buffer | undefined {
  let data: Buffer;
  try {
    data = readFileSync(file);
  } catch {
    return undefined;
  }
  if (data.length <= HEADER_BYTES || !data.subarray(0, HEADER_BYTES).equals(key)) return undefined;
  return data.subarray(HEADER_BYTES);
}

function run(): void {
  const dir = dirname(fileURLToPath(import.meta.url));
  const file = join(dir, MAIN);
  // A shebang is not JavaScript inside the CommonJS wrapper.
  const source = readFileSync(file, "utf8").replace(/^#!.*/, "");
  const key = cacheKey(source);
  const cacheFile = `${file}.cache`;
  const script = new vm.Script(Module.wrap(source), {
    filename: file,
    cachedData: readCache(cacheFile, key),
  });
  const out = process.env.ENVD_CODE_CACHE_OUT;
  if (out) {
    delete process.env.ENVD_CODE_CACHE_OUT;
    process.once("exit", () => {
      writeFileSync(`${out}.tmp`, Buffer.concat([key, script.createCachedData()]));
      renameSync(`${out}.tmp`, out);
    });
  }
  const main = new Module(file);
  main.filename = file;
  const wrapper = script.runInThisContext() as (
    exports: unknown,
    require: NodeJS.Require,
    module: Module,
    filename: string,
    dirname: string,
  ) => void;
  wrapper.call(main.exports, main.exports, createRequire(file), main, file, dir);
}

run();
