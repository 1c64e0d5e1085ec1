#!/usr/bin/env node
// How a node gets the shipped templates: made by the template builder (debootstrap, apt, RUN steps) vs pulled
// from the cluster's template store (templates/sharing.ts), through a directory and through an OCI registry
// (Debian's docker-registry on loopback). Prints figures; asserts nothing. Run as root after `npx tsc --build`, on a host
// whose template cache has the templates built (`npm run bench:shipped -w control-plane`; BENCH_TEMPLATES=base to
// measure `base` only). What a build costs is in the node agent's log (`template built`) and the build's own log.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { createLogger } from "../dist/node-agent/log.js";
import { StoreSharedTemplates } from "../dist/node-agent/shipped-templates.js";
import { TemplateStore } from "../dist/templates/store.js";

const TEMPLATES = (process.env.BENCH_TEMPLATES ?? "base,code-interpreter-v1").split(",");
const HOST_CACHE = process.env.WARREN_TEMPLATES_DIR ?? "/var/lib/warren/templates";
const tmp = mkdtempSync(join("/var/lib/warren", "bench-shipped-"));
const prefix = `bsh${randomBytes(3).toString("hex")}:`;
const log = createLogger("bench", { level: "warn" });
const opened = [];
const noCheck = async () => undefined;

function node(name, uidBase, dir, url) {
  const shared = new StoreSharedTemplates({
    store: { url, insecure: url.startsWith("docker://") },
    workDir: join(tmp, `${name}-work`),
    redisUrl: process.env.WARREN_REDIS_URL ?? "redis://127.0.0.1:6379",
    redisPrefix: prefix,
    nodeId: name,
  });
  opened.push(shared);
  return { shared, templates: new TemplateStore({ dir, uidBase, shared, log }) };
}

async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function startRegistry(dir) {
  const port = await freePort();
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, "config.yml"),
    `version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/storage\nhttp:\n  addr: 127.0.0.1:${port}\n  secret: bench\n`,
  );
  const child = spawn("docker-registry", ["serve", join(dir, "config.yml")], { stdio: "ignore" });
  for (let i = 0; i < 200; i++) {
    const ok = await fetch(`http://127.0.0.1:${port}/v2/`).then(
      (r) => r.ok,
      () => false,
    );
    if (ok) return { host: `127.0.0.1:${port}`, child };
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("registry did not start");
}

const seconds = (started) => ((performance.now() - started) / 1000).toFixed(1);

async function measure(label, url) {
  // The publisher is this host's cache (uid base 100000); the puller a fresh cache with another uid base.
  const publisher = node(`${label}-pub`, 100_000, HOST_CACHE, url);
  for (const id of TEMPLATES) {
    if (!publisher.templates.ready(id)) throw new Error(`template '${id}' is not built in ${HOST_CACHE}`);
    const started = performance.now();
    // As an agent offers what it has: a child built here goes as its difference over its parent's copy.
    await publisher.templates.offer(id);
    const record = (await publisher.templates.manifest(id)).published?.at(-1);
    if (record?.store !== publisher.shared.description) throw new Error(`publishing '${id}' failed (logged above)`);
    const layered = record.layeredOn ? `, over ${record.layeredOn.split("-")[0]}` : "";
    console.log(`${label}: publish ${id} (${Math.round(record.bytes / 2 ** 20)} MiB${layered}): ${seconds(started)} s`);
  }
  const puller = node(`${label}-pull`, 300_000, join(tmp, `${label}-pull-templates`), url);
  for (const id of TEMPLATES) {
    const started = performance.now();
    await puller.templates.ensure(id, noCheck);
    console.log(`${label}: pull ${id} into an empty cache (another uid base): ${seconds(started)} s`);
  }
}

const registry = await startRegistry(join(tmp, "registry"));
try {
  await measure("directory", `oci:${join(tmp, "store")}`);
  await measure("registry", `docker://${registry.host}/warren`);
} finally {
  registry.child.kill();
  for (const shared of opened) await shared.close();
  rmSync(tmp, { recursive: true, force: true });
}
