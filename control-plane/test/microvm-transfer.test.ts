import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createReadStream, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import type { Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { initEnvd } from "../src/node-agent/envd-client.js";
import { createLogger, type Logger, silentLogger } from "../src/node-agent/log.js";
import type { Instance } from "../src/runtime/driver.js";
import type { MicrovmDriver } from "../src/runtime/microvm/driver.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";
import { type BuiltTemplate, TemplateStore } from "../src/templates/store.js";
import { MEMORY_PROCESS, reportMemory } from "./memory-process.js";
import { BUILD_TIMEOUT_MS, sdkSandbox, testConfig } from "./node-agent-harness.js";

// Sandbox snapshots moving between two microvm "nodes" (two drivers on this host with their own state dirs, tags
// and networks), as relocation.ts drives them through the node agents: exportSnapshot on one, importSnapshot of
// that stream on the other. TCG (CI has no real KVM). The two nodes share the host's image cache, but the
// exported disk is standalone, so nothing of the source node's files is used by the target.
const nodeA = testConfig({ instance: "mt", cidr: "10.241.0.0/24", extraEnv: { WARREN_DRIVER: "microvm-tcg" } });
const nodeB = testConfig({ instance: "mu", cidr: "10.241.4.0/24", extraEnv: { WARREN_DRIVER: "microvm-tcg" } });
const log: Logger = process.env.WARREN_TEST_LOG ? createLogger("node-agent", { level: "debug" }) : silentLogger;
const TOKEN = "token-mt-source";
let a: MicrovmDriver;
let b: MicrovmDriver;
let template: BuiltTemplate;
const work = mkdtempSync(join(tmpdir(), "warren-mt-"));

async function newDriver(config: typeof nodeA): Promise<MicrovmDriver> {
  const { probe, microvm } = await selectRuntime(config, log);
  expect(probe.driver).toBe("microvm-tcg");
  if (!microvm) throw new Error("the probe did not give a microvm driver");
  await microvm.start();
  return microvm;
}

async function purge(d: MicrovmDriver): Promise<void> {
  const { adopted } = await d.reconcile();
  for (const instance of adopted) await d.kill(instance.instanceId);
  for (const snapshot of await d.listSnapshots()) await d.deleteSnapshot(snapshot.snapshotId);
}

/** Every name in a node's snapshot directory, hidden ones (`.tmp-*`) included. */
function snapshotDirs(config: typeof nodeA): string[] {
  const root = `${config.stateDir}/sandbox-snapshots`;
  return existsSync(root) ? readdirSync(root).sort() : [];
}

function backingFile(path: string): string | undefined {
  const info = JSON.parse(execFileSync("qemu-img", ["info", "-U", "--output=json", path], { encoding: "utf8" }));
  return info["backing-filename"];
}

const sdkOf = (instance: Instance): Sandbox => sdkSandbox(instance.instanceId, instance.envdUrl, TOKEN);

async function sh(sandbox: Sandbox, command: string): Promise<string> {
  return (await sandbox.commands.run(command, { timeoutMs: 60_000 })).stdout.trim();
}

/** `tar` of files in `dir`, in this order, as a stream (what a hand-made or tampered export looks like). */
function tarStream(dir: string, names: readonly string[]): AsyncIterable<Uint8Array> {
  // Written to a file first: a tar that fails says why here (the stream would only be empty or short).
  const file = join(work, `stream-${randomBytes(4).toString("hex")}.tar`);
  execFileSync("tar", ["--create", "--format=gnu", "-f", file, "-C", dir, "--", ...names]);
  return createReadStream(file);
}

/** The first `limit` bytes of a stream, then its end (the consumer of `data` stops early). */
async function* truncated(data: AsyncIterable<Uint8Array>, limit: number): AsyncGenerator<Uint8Array> {
  let sent = 0;
  for await (const chunk of data) {
    const part = chunk.subarray(0, limit - sent);
    sent += part.byteLength;
    yield part;
    if (sent >= limit) return;
  }
}

let source: Instance;
let fork: Instance | undefined;
let pid: number;
let before: { secret: string; count: number };

beforeAll(async () => {
  a = await newDriver(nodeA);
  b = await newDriver(nodeB);
  await purge(a);
  await purge(b);
  const templates = new TemplateStore({ dir: nodeA.templatesDir, uidBase: nodeA.uidBase, log });
  template = await templates.ensure("base", async (image) => {
    const instance = await a.create({ template: image, resources: templates.recipe("base").defaults });
    await a.kill(instance.instanceId);
  });
  await a.ensureSnapshot(template, template.recipe.defaults);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const d of [a, b]) if (d) await purge(d);
  rmSync(work, { recursive: true, force: true });
}, 180_000);

describe("microvm snapshots moving between nodes (QEMU microvm, TCG)", () => {
  it("a running sandbox's memory snapshot moves to another node: its process (same pid, same memory) and files continue there", async () => {
    source = await a.create({ template, resources: template.recipe.defaults });
    await initEnvd(source.envdUrl, {
      envVars: {},
      accessToken: TOKEN,
      defaultUser: "user",
      defaultWorkdir: "/home/user",
    });
    const sandbox = sdkOf(source);
    await sandbox.files.write("/home/user/moved.txt", "written on node A");
    pid = (await sandbox.commands.run(MEMORY_PROCESS, { background: true, timeoutMs: 0 })).pid;
    before = await reportMemory(sandbox, pid);
    expect((await a.snapshot(source.instanceId, "mt-run")).memory).toBe(true);

    // Straight from A's export into B's import, as the target agent pulls it from the source agent.
    const image = await b.importSnapshot("mt-run", a.exportSnapshot("mt-run"));
    expect(image).toMatchObject({
      snapshotId: "mt-run",
      driver: "microvm-tcg",
      templateId: "base",
      templateHash: template.hash,
      memory: true,
      resources: template.recipe.defaults,
    });
    expect(image.sizeBytes).toBeGreaterThan(0);
    expect(await b.listSnapshots()).toEqual([image]);
    expect(snapshotDirs(nodeB)).toEqual(["mt-run"]);
    // Self-contained: the imported disk has no backing file (A's snapshot's does: the template snapshot's disk).
    expect(backingFile(`${nodeA.stateDir}/sandbox-snapshots/mt-run/disk.qcow2`)).toBeDefined();
    expect(backingFile(`${nodeB.stateDir}/sandbox-snapshots/mt-run/disk.qcow2`)).toBeUndefined();
    // The export's staging directory is gone.
    expect(snapshotDirs(nodeA)).toEqual(["mt-run"]);
    await expect(b.importSnapshot("mt-run", a.exportSnapshot("mt-run"))).rejects.toThrow(
      "snapshot 'mt-run' already exists",
    );

    // Gone from A: B does not need anything of A.
    await a.kill(source.instanceId);
    await a.deleteSnapshot("mt-run");
    expect(snapshotDirs(nodeA)).toEqual([]);

    fork = await b.create({ template, resources: template.recipe.defaults, snapshotId: "mt-run" });
    const moved = sdkOf(fork);
    expect(await moved.files.read("/home/user/moved.txt")).toBe("written on node A");
    expect(await sh(moved, `tr '\\0' ' ' < /proc/${pid}/cmdline`)).toContain("while :; do n=$((n+1))");
    const after = await reportMemory(moved, pid);
    expect(after.secret).toBe(before.secret);
    expect(after.count).toBeGreaterThanOrEqual(before.count);
  }, 300_000);

  it("refused streams leave nothing: truncated, corrupted, an unexpected entry, a link, a disk with a backing file, another QEMU", async () => {
    // An export of the imported snapshot (its disk standalone already), kept in a file to take apart.
    const full = join(work, "mt-run.tar");
    const parts: Buffer[] = [];
    for await (const chunk of b.exportSnapshot("mt-run")) parts.push(Buffer.from(chunk));
    writeFileSync(full, Buffer.concat(parts));
    const files = join(work, "files");
    execFileSync("mkdir", ["-p", files]);
    execFileSync("tar", ["--extract", "-C", files, "-f", full]);
    expect(readdirSync(files).sort()).toEqual(["disk.qcow2", "memory.snap", "meta.json"]);
    const meta = JSON.parse(readFileSync(join(files, "meta.json"), "utf8"));
    expect(meta).toMatchObject({ snapshotId: "mt-run", memory: true, format: "warren-microvm-snapshot/1" });
    expect(meta.vm.qemu).toMatch(/^\d+\.\d+/);
    const nothingLeft = () => expect(snapshotDirs(nodeB)).toEqual(["mt-run"]);

    // Cut off in the middle (the export's consumer stops early: its tar ends, its staging directory goes).
    await expect(b.importSnapshot("mt-cut", truncated(b.exportSnapshot("mt-run"), 3 * 2 ** 20))).rejects.toThrow(
      /the stream ended early/,
    );
    nothingLeft();

    // One byte changed inside disk.qcow2's data (after meta.json's header and body and disk.qcow2's header).
    const bytes = readFileSync(full);
    const at = 512 + Math.ceil(Buffer.byteLength(JSON.stringify(meta)) / 512) * 512 + 512 + 100_000;
    bytes[at] = (bytes[at] ?? 0) ^ 0xff;
    await expect(b.importSnapshot("mt-corrupt", Readable.from([bytes]))).rejects.toThrow(
      "'disk.qcow2' does not match its SHA-256 in meta.json",
    );
    nothingLeft();

    writeFileSync(join(files, "notes.txt"), "not part of a snapshot");
    await expect(
      b.importSnapshot("mt-extra", tarStream(files, ["meta.json", "notes.txt", "disk.qcow2", "memory.snap"])),
    ).rejects.toThrow("unexpected entry 'notes.txt'");
    nothingLeft();

    const linked = join(work, "linked");
    execFileSync("mkdir", ["-p", linked]);
    execFileSync("cp", [join(files, "meta.json"), linked]);
    execFileSync("ln", ["-s", "/etc/hostname", join(linked, "disk.qcow2")]);
    await expect(b.importSnapshot("mt-link", tarStream(linked, ["meta.json", "disk.qcow2"]))).rejects.toThrow(
      "entry 'disk.qcow2' is a symbolic link, not a regular file",
    );
    nothingLeft();

    // A files-only snapshot whose disk is a layer over a file of this host, with a matching meta.json.
    const backed = join(work, "backed");
    execFileSync("mkdir", ["-p", backed]);
    execFileSync("qemu-img", [
      "create",
      "-q",
      "-f",
      "qcow2",
      "-b",
      join(files, "disk.qcow2"),
      "-F",
      "qcow2",
      join(backed, "disk.qcow2"),
    ]);
    const sha = execFileSync("sha256sum", [join(backed, "disk.qcow2")], { encoding: "utf8" }).split(" ")[0];
    const size = readFileSync(join(backed, "disk.qcow2")).length;
    const { vm: _vm, ...filesOnly } = meta;
    writeFileSync(
      join(backed, "meta.json"),
      JSON.stringify({ ...filesOnly, memory: false, files: { "disk.qcow2": { size, sha256: sha } } }),
    );
    await expect(b.importSnapshot("mt-backed", tarStream(backed, ["meta.json", "disk.qcow2"]))).rejects.toThrow(
      "'disk.qcow2' has a backing file",
    );
    nothingLeft();

    writeFileSync(
      join(files, "meta.json"),
      JSON.stringify({ ...meta, vm: { ...meta.vm, qemu: "99.1.0 (elsewhere)" } }),
    );
    await expect(
      b.importSnapshot("mt-qemu", tarStream(files, ["meta.json", "disk.qcow2", "memory.snap"])),
    ).rejects.toThrow(`made with QEMU '99.1.0 (elsewhere)' (this node: '${meta.vm.qemu}')`);
    nothingLeft();

    // The untampered stream, from the file, is taken.
    const copy = await b.importSnapshot("mt-copy", createReadStream(full));
    expect(copy).toMatchObject({ snapshotId: "mt-copy", memory: true, templateHash: template.hash });
    await b.deleteSnapshot("mt-copy");
    nothingLeft();
  }, 300_000);

  it("a files-only snapshot (of a stopped sandbox) moves too; an instance from it boots fresh over its files", async () => {
    if (!fork) throw new Error("the first test made no instance on node B");
    await sdkOf(fork).files.write("/home/user/stopped.txt", "written on node B");
    await b.pause(fork.instanceId);
    await b.stop(fork.instanceId);
    // Its disk is a layer over the imported snapshot's: the export flattens both.
    expect((await b.snapshot(fork.instanceId, "mu-files")).memory).toBe(false);
    const image = await a.importSnapshot("mu-files", b.exportSnapshot("mu-files"));
    expect(image).toMatchObject({ snapshotId: "mu-files", memory: false, templateHash: template.hash });
    expect(backingFile(`${nodeA.stateDir}/sandbox-snapshots/mu-files/disk.qcow2`)).toBeUndefined();
    await b.deleteSnapshot("mu-files");
    await b.deleteSnapshot("mt-run");
    await b.kill(fork.instanceId);
    fork = undefined;
    expect(snapshotDirs(nodeB)).toEqual([]);

    // Files only: any memory size will do.
    const booted = await a.create({
      template,
      resources: { ...template.recipe.defaults, memoryMB: 384 },
      snapshotId: "mu-files",
    });
    try {
      await initEnvd(booted.envdUrl, {
        envVars: {},
        accessToken: TOKEN,
        defaultUser: "user",
        defaultWorkdir: "/home/user",
      });
      const sandbox = sdkOf(booted);
      expect(await sandbox.files.read("/home/user/moved.txt")).toBe("written on node A");
      expect(await sandbox.files.read("/home/user/stopped.txt")).toBe("written on node B");
      // A fresh boot: the source's process is not there.
      expect(await sh(sandbox, `tr '\\0' ' ' < /proc/${pid}/cmdline 2>/dev/null; true`)).not.toContain("n=$((n+1))");
    } finally {
      await a.kill(booted.instanceId);
    }
    await a.deleteSnapshot("mu-files");
    expect(snapshotDirs(nodeA)).toEqual([]);
  }, 600_000);
});
