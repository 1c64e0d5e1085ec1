#!/usr/bin/env node
/**
 * Runs E2B's own public JS test suites, unmodified, against a single-node Warren started here:
 *   - e2b-dev/E2B              packages/js-sdk/tests  (the `e2b` SDK)
 *   - e2b-dev/code-interpreter js/tests               (`@e2b/code-interpreter`)
 * from checkouts a developer fetched (never part of this repository). The suites import `../src`; a generated
 * vitest config redirects every import of the suite's `src/` to the published npm package this repository pins
 * (e2b@2.51.0, @e2b/code-interpreter@2.8.0) and resolves their other packages from this repository's
 * node_modules, so not one of their files is edited. Files run one at a time, 60 s per test.
 *
 * Modes: `url` (E2B_API_URL + E2B_SANDBOX_URL, plain HTTP, header routing) and `domain` (only E2B_DOMAIN: the proxy
 * serves https://api.<domain> and https://<port>-<id>.<domain> with a wildcard certificate from a test CA, and
 * `*.<domain>` resolves to the proxy's loopback address). In both modes the test process resolves names through
 * loopback-dns: every name but the cluster's fails, so no test reaches the internet (E2B's own defaults,
 * `api.e2b.app`, included).
 *
 * Usage (as root, after `npm run build`):
 *   E2B_JS_SDK_CHECKOUT=/path/to/E2B E2B_CODE_INTERPRETER_CHECKOUT=/path/to/code-interpreter \
 *     npm run suites -w e2e -- [--mode url|domain|both] [--suite js-sdk|code-interpreter|all] [--only <text>]
 *       [--instance-prefix h] [--node-cidr 10.233.0.0/22] [--json <file>] [--list-excluded]
 *       [--image-cache /var/cache/warren-e2b-suites]  (the stand-in images' roots, e2b-suites-images.mjs)
 */
import { execFileSync, spawn } from "node:child_process";
import { randomInt } from "node:crypto";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { EXCLUDED } from "./e2b-suites-excluded.mjs";
import { startImageMirror } from "./e2b-suites-images.mjs";

const E2E_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const REPO_ROOT = resolve(E2E_DIR, "..");
const VITEST = join(REPO_ROOT, "node_modules/vitest/vitest.mjs");
const DOMAIN = "warren.test"; // RFC 2606: never a real domain
/** Whole-file cap on top of the per-test 60 s: a file that hangs is killed and counted as failed. */
const FILE_CAP_MS = 20 * 60_000;

/** Where each suite lives in its repository and which npm package its `src/` stands for. */
const SUITES = {
  "js-sdk": {
    checkoutEnv: "E2B_JS_SDK_CHECKOUT",
    packageDir: "packages/js-sdk",
    npmPackage: "e2b",
    template: "base",
    // Packages its tests import that this repository does not install (msw mocks fetch in its offline tests).
    extraPackages: ["msw", "dotenv"],
  },
  "code-interpreter": {
    checkoutEnv: "E2B_CODE_INTERPRETER_CHECKOUT",
    packageDir: "js",
    npmPackage: "@e2b/code-interpreter",
    template: "code-interpreter-v1",
    extraPackages: ["dotenv"],
  },
};

const { values: args } = parseArgs({
  options: {
    mode: { type: "string", default: "both" },
    suite: { type: "string", default: "all" },
    only: { type: "string" },
    "instance-prefix": { type: "string", default: process.env.WARREN_SUITES_INSTANCE_PREFIX ?? "h" },
    "node-cidr": { type: "string", default: process.env.WARREN_SUITES_NODE_CIDR ?? "10.233.0.0/22" },
    "js-sdk": { type: "string", default: process.env.E2B_JS_SDK_CHECKOUT },
    "code-interpreter": { type: "string", default: process.env.E2B_CODE_INTERPRETER_CHECKOUT },
    json: { type: "string" },
    "work-dir": { type: "string" },
    "image-cache": { type: "string", default: "/var/cache/warren-e2b-suites" },
    "list-excluded": { type: "boolean", default: false },
  },
});

function fail(message) {
  console.error(`e2b-suites: ${message}`);
  process.exit(2);
}

if (args["list-excluded"]) {
  for (const e of EXCLUDED) {
    console.log(`${e.suite}  ${e.file}${e.test ? ` > ${e.test}` : ""}  [${e.modes.join(",")}]  ${e.reason}`);
  }
  process.exit(0);
}

const modes = args.mode === "both" ? ["url", "domain"] : [args.mode];
if (!modes.every((m) => m === "url" || m === "domain")) fail(`--mode must be url, domain or both, got '${args.mode}'`);
const suiteNames = args.suite === "all" ? Object.keys(SUITES) : [args.suite];
for (const name of suiteNames) {
  const suite = SUITES[name];
  if (!suite) fail(`--suite must be js-sdk, code-interpreter or all, got '${name}'`);
  const checkout = args[name];
  if (!checkout) fail(`no checkout for ${name}: pass --${name} <path> or set ${suite.checkoutEnv}`);
  if (!existsSync(join(checkout, suite.packageDir, "tests"))) {
    fail(`${checkout} has no ${suite.packageDir}/tests (expected a checkout of ${name}'s repository)`);
  }
}
if (!existsSync(join(E2E_DIR, "..", "local", "dist", "cluster.js")))
  fail("Warren is not built: run `npm run build` first");

const workDir = args["work-dir"] ?? mkdtempSync(join(tmpdir(), "warren-e2b-suites-"));
// The clusters' private PostgreSQL (user postgres) lives below it: mkdtemp's 0700 would keep it out.
if (!args["work-dir"]) chmodSync(workDir, 0o711);
mkdirSync(workDir, { recursive: true });

/** The suite's own versions of the packages it needs beyond this repository, in a folder outside the repository. */
function installExtraPackages() {
  const depsDir = join(workDir, "deps");
  const wanted = new Map();
  for (const name of suiteNames) {
    const suite = SUITES[name];
    const manifest = JSON.parse(readFileSync(join(args[name], suite.packageDir, "package.json"), "utf8"));
    const all = { ...manifest.dependencies, ...manifest.devDependencies };
    for (const pkg of suite.extraPackages) if (all[pkg]) wanted.set(pkg, all[pkg]);
  }
  const missing = [...wanted].filter(([pkg]) => !existsSync(join(depsDir, "node_modules", pkg, "package.json")));
  if (missing.length > 0) {
    mkdirSync(depsDir, { recursive: true });
    if (!existsSync(join(depsDir, "package.json"))) writeFileSync(join(depsDir, "package.json"), "{}\n");
    console.log(
      `installing the suites' test packages into ${depsDir}: ${missing.map(([p, v]) => `${p}@${v}`).join(" ")}`,
    );
    execFileSync(
      "npm",
      ["install", "--no-audit", "--no-fund", "--ignore-scripts", ...missing.map(([p, v]) => `${p}@${v}`)],
      { cwd: depsDir, stdio: "inherit" },
    );
  }
  return depsDir;
}

/**
 * A vitest config of our own for one suite: its `src/` is the npm package, bare imports resolve from this
 * repository (then from the suites' extra packages), caches stay out of the checkout.
 */
function writeVitestConfig(name, depsDir) {
  const suite = SUITES[name];
  const root = resolve(args[name], suite.packageDir);
  const file = join(workDir, `vitest.${name}.config.mjs`);
  const config = `// Generated by e2b/scripts/e2b-suites.mjs: E2B's ${name} tests against npm ${suite.npmPackage}.
import { dirname, isAbsolute, resolve, sep } from "node:path";
const SUITE_ROOT = ${JSON.stringify(root)};
const SUITE_SRC = ${JSON.stringify(join(root, "src"))};
const FROM_REPO = ${JSON.stringify(join(E2E_DIR, "package.json"))};
const FROM_DEPS = ${JSON.stringify(join(depsDir, "package.json"))};
const NPM_PACKAGE = ${JSON.stringify(suite.npmPackage)};
const inside = (path, dir) => path === dir || path.startsWith(dir + sep);
export default {
  cacheDir: ${JSON.stringify(join(workDir, `vite-cache-${name}`))},
  plugins: [
    {
      name: "warren-suite-src-to-npm",
      enforce: "pre",
      async resolveId(source, importer) {
        if (!importer || !inside(importer, SUITE_ROOT) || source.startsWith("\\0")) return null;
        if (source.startsWith(".")) {
          const target = resolve(dirname(importer), source);
          if (!inside(target, SUITE_SRC)) return null;
          return this.resolve(NPM_PACKAGE, FROM_REPO, { skipSelf: true });
        }
        if (isAbsolute(source) || source.startsWith("node:") || source.includes(":")) return null;
        return (
          (await this.resolve(source, FROM_REPO, { skipSelf: true })) ??
          (await this.resolve(source, FROM_DEPS, { skipSelf: true }))
        );
      },
    },
  ],
  test: {
    root: SUITE_ROOT,
    include: ["tests/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    isolate: true,
    globals: false,
    environment: "node",
    pool: "forks",
    fileParallelism: false,
    server: { deps: { fallbackCJS: true } },
    deps: { interopDefault: true },
  },
};
`;
  writeFileSync(file, config);
  return file;
}

/** Test files of a suite, relative to its package, minus whole files excluded in this mode. */
function testFiles(name, mode) {
  const root = resolve(args[name], SUITES[name].packageDir);
  const out = [];
  const walk = (dir) => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) walk(path);
      else if (entry.endsWith(".test.ts")) out.push(relative(root, path).split(sep).join("/"));
    }
  };
  walk(join(root, "tests"));
  return out
    .sort()
    .filter((file) => !args.only || file.includes(args.only))
    .filter((file) => !excludedFile(name, file, mode));
}

function matches(pattern, file) {
  return pattern.endsWith("/**") ? file.startsWith(pattern.slice(0, -2)) : pattern === file;
}

function excludedFile(suite, file, mode) {
  return EXCLUDED.find((e) => e.suite === suite && !e.test && e.modes.includes(mode) && matches(e.file, file));
}

function excludedTests(suite, file, mode) {
  return EXCLUDED.filter((e) => e.suite === suite && e.test && e.modes.includes(mode) && matches(e.file, file));
}

const escapeRegex = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** Runs one test file in a vitest process of its own; resolves to its per-test outcomes. */
function runFile(name, file, mode, configFile, clientEnv) {
  const outputFile = join(workDir, "results", mode, name, `${file.replace(/[/]/g, "__")}.json`);
  mkdirSync(dirname(outputFile), { recursive: true });
  rmSync(outputFile, { force: true });
  const skip = excludedTests(name, file, mode);
  const vitestArgs = [VITEST, "run", "--config", configFile, file, "--reporter=json", `--outputFile=${outputFile}`];
  // Excluded tests by name: a pattern that matches every full name ("<describe> <test>") but those ending in
  // theirs, so vitest reports them skipped.
  if (skip.length > 0) {
    const names = skip.map((e) => escapeRegex(e.test)).join("|");
    vitestArgs.push("--testNamePattern", `^(?!.*(?:^| )(?:${names})$).*$`);
  }
  return new Promise((done) => {
    const child = spawn(process.execPath, vitestArgs, {
      cwd: resolve(args[name], SUITES[name].packageDir),
      env: clientEnv,
      stdio: ["ignore", "pipe", "pipe"],
    });
    const chunks = [];
    child.stdout.on("data", (chunk) => chunks.push(chunk));
    child.stderr.on("data", (chunk) => chunks.push(chunk));
    const cap = setTimeout(() => child.kill("SIGKILL"), FILE_CAP_MS);
    child.on("close", () => {
      clearTimeout(cap);
      const log = Buffer.concat(chunks).toString("utf8");
      writeFileSync(`${outputFile}.log`, log);
      done(readOutcome(outputFile, file, log));
    });
  });
}

/** Per-test outcomes from vitest's JSON report; a file that did not load counts as one failed entry. */
function readOutcome(outputFile, file, log) {
  if (!existsSync(outputFile)) {
    return { file, tests: [], loadError: `no report (vitest output: ${log.trim().split("\n").slice(-5).join(" | ")})` };
  }
  const report = JSON.parse(readFileSync(outputFile, "utf8"));
  const tests = [];
  let loadError;
  for (const result of report.testResults ?? []) {
    if (result.assertionResults.length === 0 && result.status === "failed") loadError = result.message;
    for (const a of result.assertionResults) {
      tests.push({
        name: a.fullName,
        status: a.status === "passed" ? "passed" : a.status === "failed" ? "failed" : "skipped",
        error: a.failureMessages?.[0]?.split("\n")[0],
      });
    }
  }
  return { file, tests, loadError };
}

async function freeTlsPort(host) {
  const tryListen = (port) =>
    new Promise((done) => {
      const server = createServer();
      server.once("error", () => done(undefined));
      server.listen(port, host, () => {
        const address = server.address();
        server.close(() => done(typeof address === "object" && address ? address.port : undefined));
      });
    });
  return (await tryListen(443)) ?? (await tryListen(0));
}

/** One cluster per mode: plain HTTP for `url`, the proxy's TLS listener on its own loopback address for `domain`. */
async function startCluster(mode, imageMirror) {
  const { LocalCluster } = await import("@warren/local");
  const dataDir = join(workDir, `cluster-${mode}`);
  rmSync(dataDir, { recursive: true, force: true });
  // Every template a selected suite starts sandboxes from is built and pooled before the first test.
  const templates = [...new Set(["base", ...suiteNames.map((name) => SUITES[name].template)])].join(",");
  const common = {
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: args["instance-prefix"],
    nodeCidr: () => args["node-cidr"],
    readyTemplates: templates.split(","),
    env: {
      WARREN_PREBUILD_TEMPLATES: templates,
      WARREN_POOL_TEMPLATES: templates,
      // Nothing leaves the machine (as vitest.config.ts sets for every test): the host's uplink forwarding is left
      // off, sandboxes' DNS goes to the discard port, and an image pull asks the loopback mirror of stand-ins
      // (e2b-suites-images.mjs; a dead loopback port when no suite builds from images), never Docker Hub.
      WARREN_UPLINK_FORWARDING: "0",
      WARREN_DNS_UPSTREAM: "127.0.0.1:9",
      WARREN_IMAGE_MIRROR: imageMirror ?? "127.0.0.1:9",
      ...(imageMirror ? { WARREN_INSECURE_REGISTRIES: imageMirror } : {}),
    },
    onProgress: (line) => console.log(`  [cluster ${mode}] ${line}`),
  };
  if (mode === "url") {
    const cluster = new LocalCluster(common);
    const env = await cluster.start();
    return {
      cluster,
      clientEnv: {
        E2B_API_URL: env.E2B_API_URL,
        E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
        E2B_API_KEY: env.E2B_API_KEY,
        // Nothing but IP addresses resolves: names (E2B's default domain among them) fail without a query.
        WARREN_LOOPBACK_DOMAIN: "url-mode.invalid",
        WARREN_LOOPBACK_ADDRESS: "127.0.0.1",
      },
    };
  }
  const { makeTestCertificates } = await import("@warren/local/test-certificates");
  const certificates = makeTestCertificates(join(dataDir, "tls"), DOMAIN);
  const proxyHost = `127.${randomInt(1, 255)}.${randomInt(0, 256)}.${randomInt(1, 255)}`;
  const cluster = new LocalCluster({
    ...common,
    proxyHost,
    proxyPort: await freeTlsPort(proxyHost),
    tls: { domain: DOMAIN, ...certificates },
  });
  const env = await cluster.start();
  return {
    cluster,
    clientEnv: {
      E2B_DOMAIN: env.E2B_DOMAIN,
      E2B_API_KEY: env.E2B_API_KEY,
      NODE_EXTRA_CA_CERTS: certificates.caFile,
      WARREN_LOOPBACK_DOMAIN: DOMAIN,
      WARREN_LOOPBACK_ADDRESS: proxyHost,
    },
  };
}

function summarize(outcome) {
  const count = (status) => outcome.tests.filter((t) => t.status === status).length;
  return { passed: count("passed"), failed: count("failed") + (outcome.loadError ? 1 : 0), skipped: count("skipped") };
}

async function main() {
  const depsDir = installExtraPackages();
  const report = { startedAt: new Date().toISOString(), modes: {} };
  // E2B's template tests build from Docker Hub's `ubuntu:22.04`: served by a loopback mirror of stand-ins.
  imageMirror = suiteNames.includes("js-sdk")
    ? await startImageMirror({
        workDir,
        cacheDir: args["image-cache"],
        log: (line) => console.log(`  [images] ${line}`),
      })
    : undefined;
  try {
    for (const mode of modes) {
      console.log(`\n=== mode ${mode}: starting a single-node Warren (instance prefix '${args["instance-prefix"]}')`);
      const { cluster, clientEnv } = await startCluster(mode, imageMirror?.host);
      running = cluster;
      report.modes[mode] = {};
      try {
        for (const name of suiteNames) {
          const configFile = writeVitestConfig(name, depsDir);
          const env = {
            PATH: process.env.PATH,
            HOME: process.env.HOME,
            ...clientEnv,
            NODE_OPTIONS: `--import=${join(E2E_DIR, "dist/loopback-dns.js")}`,
            E2B_TESTS_TEMPLATE: SUITES[name].template,
          };
          const totals = { passed: 0, failed: 0, skipped: 0 };
          const files = [];
          console.log(`\n--- ${name} (${mode} mode)`);
          for (const file of testFiles(name, mode)) {
            const outcome = await runFile(name, file, mode, configFile, env);
            const counts = summarize(outcome);
            for (const key of Object.keys(totals)) totals[key] += counts[key];
            files.push({ ...outcome, ...counts });
            const mark = counts.failed > 0 ? "FAIL" : "ok  ";
            console.log(
              `${mark} ${file}: ${counts.passed} passed, ${counts.failed} failed${counts.skipped ? `, ${counts.skipped} skipped` : ""}`,
            );
            if (outcome.loadError) console.log(`       load error: ${outcome.loadError.split("\n")[0]}`);
            for (const t of outcome.tests.filter((x) => x.status === "failed")) {
              console.log(`       x ${t.name}: ${t.error ?? ""}`.slice(0, 400));
            }
          }
          console.log(
            `=== ${name} ${mode}: ${totals.passed} passed, ${totals.failed} failed, ${totals.skipped} skipped (${files.length} files)`,
          );
          report.modes[mode][name] = { totals, files };
        }
      } finally {
        running = undefined;
        await cluster.stop();
      }
    }
  } finally {
    await imageMirror?.stop();
    imageMirror = undefined;
  }
  console.log("\n=== totals");
  for (const [mode, suites] of Object.entries(report.modes)) {
    for (const [name, { totals }] of Object.entries(suites)) {
      console.log(`${mode.padEnd(6)} ${name.padEnd(16)} ${totals.passed} / ${totals.passed + totals.failed} passed`);
    }
  }
  if (args.json) writeFileSync(args.json, `${JSON.stringify(report, null, 2)}\n`);
  console.log(`(per-file reports and logs in ${join(workDir, "results")})`);
  const failed = Object.values(report.modes).some((s) => Object.values(s).some((x) => x.totals.failed > 0));
  process.exit(failed ? 1 : 0);
}

/** The cluster of the mode being run: stopped (its sandboxes removed) when the runner is interrupted. */
let running;
/** The loopback image mirror, while it runs. */
let imageMirror;
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    console.error(`e2b-suites: ${signal}: stopping the cluster`);
    const stopping = Promise.allSettled([running?.stop(), imageMirror?.stop()]);
    stopping.finally(() => process.exit(130));
  });
}
await main();
