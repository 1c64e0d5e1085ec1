#!/usr/bin/env node
// Writes envd's V8 code cache (dist/envd-main.cjs.cache, read by dist/envd.cjs: src/launcher.ts) after the bundle
// and warren-exec are built: starts envd on loopback as sandboxes start it (this Node.js, no V8 flags), lets it warm
// up (one `bash -l -c true` through its own Connect API), stops it, and the launcher writes every function compiled
// until then. Without a cache (this step failed, or another Node.js runs envd) envd compiles at each start as
// before, so a failure here is reported and does not fail the build.
import { spawn } from "node:child_process";
import { existsSync, rmSync, statSync } from "node:fs";
import { userInfo } from "node:os";
import { fileURLToPath } from "node:url";

const dist = fileURLToPath(new URL("../dist/", import.meta.url));
const out = `${dist}envd-main.cjs.cache`;
const TIMEOUT_MS = 30_000;
// A cache older than this run is an earlier build's, not one this run wrote.
const started = Date.now() - 1000;

function fail(reason) {
  try {
    rmSync(out, { force: true });
  } catch {
    // Not ours to remove (another user's build): the launcher checks any cache against the bundle anyway.
  }
  process.stderr.write(`envd code cache not written (envd still runs, compiling at each start): ${reason}\n`);
  process.exit(0);
}

// V8 rejects a cache made under other V8 flags: the child gets none, as in a sandbox.
const env = { ...process.env, ENVD_CODE_CACHE_OUT: out };
delete env.NODE_OPTIONS;
const child = spawn(
  process.execPath,
  [`${dist}envd.cjs`, "--host", "127.0.0.1", "--port", "0", "--default-user", userInfo().username, "--warm-up", "now"],
  { env, stdio: ["ignore", "ignore", "pipe"] },
);
let log = "";
const timer = setTimeout(() => {
  child.kill("SIGKILL");
  fail(`envd did not finish its warm-up within ${TIMEOUT_MS / 1000} s: ${log.slice(-500)}`);
}, TIMEOUT_MS);
child.stderr.setEncoding("utf8");
child.stderr.on("data", (chunk) => {
  log += chunk;
  if (/"msg":"warm-up done"/.test(log)) child.kill("SIGTERM");
  else if (/"msg":"warm-up failed"/.test(log)) child.kill("SIGKILL");
});
child.once("exit", (code, signal) => {
  clearTimeout(timer);
  const written = existsSync(out) && statSync(out).mtimeMs >= started;
  if (code !== 0 || !written) fail(`envd exited ${signal ?? code} without writing it: ${log.slice(-500)}`);
  console.log(`envd code cache written: ${out} (${Math.round(statSync(out).size / 1024)} KiB)`);
});
