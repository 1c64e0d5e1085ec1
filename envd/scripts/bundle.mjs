#!/usr/bin/env node
// Bundles envd for sandboxes (after tsc): dist/envd-main.cjs (envd and its dependencies in one CommonJS file,
// native addons external) and dist/envd.cjs (the launcher that runs it from its V8 code cache: src/launcher.ts).
// CommonJS, not ESM: Node.js loads its own modules for a CommonJS file without building ES module facades for
// them (~5 ms of a start here), and only a CommonJS wrapper can be compiled with a code cache in Node.js 20.
import { rm } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const dist = fileURLToPath(new URL("../dist/", import.meta.url));
const common = {
  bundle: true,
  platform: "node",
  format: "cjs",
  target: "node20",
  minify: true,
  logLevel: "warning",
  // `import.meta.url` in CommonJS: the file's own URL.
  define: { "import.meta.url": "__warrenModuleUrl" },
  banner: { js: "var __warrenModuleUrl=require('node:url').pathToFileURL(__filename).href;" },
};
await build({
  ...common,
  entryPoints: [`${dist}main.js`],
  outfile: `${dist}envd-main.cjs`,
  sourcemap: true,
  external: ["@lydell/node-pty", "fs-xattr"],
});
await build({ ...common, entryPoints: [`${dist}launcher.js`], outfile: `${dist}envd.cjs` });
// The ES module bundle of earlier builds, and a code cache made for an earlier bundle.
await Promise.all(
  ["envd.mjs", "envd.mjs.map", "envd-main.cjs.cache"].map((name) => rm(`${dist}${name}`, { force: true })),
);
