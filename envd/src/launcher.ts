/**
 * envd's entry point in sandboxes, bundled on its own to `dist/envd.cjs`: runs envd's bundle (`dist/envd-main.cjs`)
 * from the V8 code cache `scripts/code-cache.mjs` wrote beside it at build time, so a start does not compile the
 * bundle again, nor the functions a first command runs (10–13 ms less CPU per start here).
 *
 * The cache is used only when it was made for this bundle and this Node.js (code-cache.ts); otherwise the bundle
 * compiles as usual. Sandboxes cannot write it: the host made it, and envd's directory is bound read-only.
 *
 * With ENVD_CODE_CACHE_OUT set (the build's code-cache step only), the cache is written there when the process
 * exits, holding every function compiled until then.
 */
import { renameSync, writeFileSync } from "node:fs";
import Module, { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { codeCacheFile, compileModule } from "./code-cache.js";

const MAIN = "envd-main.cjs";

type ModuleWrapper = (
  exports: unknown,
  require: NodeJS.Require,
  module: Module,
  filename: string,
  dirname: string,
) => void;

function run(): void {
  const dir = dirname(fileURLToPath(import.meta.url));
  const file = join(dir, MAIN);
  const { script, key } = compileModule(file, `${file}.cache`);
  const out = process.env.ENVD_CODE_CACHE_OUT;
  if (out) {
    delete process.env.ENVD_CODE_CACHE_OUT;
    process.once("exit", () => {
      try {
        writeFileSync(`${out}.tmp`, codeCacheFile(key, script));
        renameSync(`${out}.tmp`, out);
      } catch (error) {
        process.stderr.write(`could not write the code cache ${out}: ${(error as Error).message}\n`);
        process.exitCode = 1;
      }
    });
  }
  const main = new Module(file);
  main.filename = file;
  const wrapper = script.runInThisContext() as ModuleWrapper;
  wrapper.call(main.exports, main.exports, createRequire(file), main, file, dir);
}

run();
