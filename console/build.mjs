// Builds the console into dist/: index.html plus content-hashed assets (served with long-lived cache headers by
// the api's /console route). Everything is bundled: nothing is fetched from another origin at run time.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const root = dirname(fileURLToPath(import.meta.url));
const out = join(root, "dist", "public");
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const result = await build({
  entryPoints: [join(root, "src", "main.tsx")],
  bundle: true,
  format: "esm",
  target: ["chrome110", "firefox115", "safari16"],
  minify: true,
  sourcemap: "linked",
  // xterm.js and the charts load with the tab that shows them, not with the first page.
  splitting: true,
  entryNames: "assets/[name]-[hash]",
  chunkNames: "assets/chunk-[hash]",
  assetNames: "assets/[name]-[hash]",
  outdir: out,
  metafile: true,
  jsx: "automatic",
  jsxImportSource: "preact",
  define: { "process.env.NODE_ENV": '"production"' },
  logLevel: "warning",
  absWorkingDir: root,
});

const outputs = Object.keys(result.metafile.outputs).map((p) => p.slice(p.indexOf("assets/")));
const entry = Object.entries(result.metafile.outputs).find(([, o]) => o.entryPoint);
const script = entry?.[0].slice(entry[0].indexOf("assets/"));
const style = entry?.[1].cssBundle?.slice(entry[1].cssBundle.indexOf("assets/"));
if (!script || !style) throw new Error(`esbuild produced no script or stylesheet: ${outputs.join(", ")}`);

// The chunks the entry imports statically are fetched in parallel with it, not after it is parsed.
const preloads = (entry?.[1].imports ?? [])
  .filter((i) => i.kind === "import-statement")
  .map((i) => `<link rel="modulepreload" href="/console/${i.path.slice(i.path.indexOf("assets/"))}" />`)
  .join("\n    ");
const template = readFileSync(join(root, "src", "index.html"), "utf8");
const html = template
  .replace("%SCRIPT%", `/console/${script}`)
  .replace("%STYLE%", `/console/${style}`)
  .replace("%PRELOADS%", preloads);
writeFileSync(join(out, "index.html"), html);
const size = outputs
  .filter((p) => !p.endsWith(".map"))
  .map((p) => `${basename(p)} ${((result.metafile.outputs[`dist/public/${p}`]?.bytes ?? 0) / 1024) | 0} KiB`);
console.log(`console built into ${out}: ${size.join(", ")}`);
