import { type ChildProcess, spawn } from "node:child_process";
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "@warren/platform/log";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ENVD_PORT, processStartTime } from "../sandbox-process.js";
import { type CgroupManager, detectCgroupManager, type SandboxCgroup } from "./cgroups.js";
import { InstanceContainers } from "./instance-container.js";
import type { InstanceRecord, InstanceRecords } from "./instance-records.js";

// The wait for a new sandbox's envd tells a slow start from a stuck one by the sandbox's CPU use: real cgroups on
// this host (the tests run as root), a process in them standing in for the sandbox, and an HTTP server on a
// loopback address of its own standing in for envd.
const PARENT = "warren/test-ready-wait";
const NAME = "iready";
const ADDR = "127.0.0.77";
const TIMEOUT_MS = 1000;

describe("waiting for a new sandbox's envd", () => {
  let cgroups: CgroupManager;
  let cgroup: SandboxCgroup;
  let child: ChildProcess | undefined;
  let envd: Server | undefined;
  const dir = mkdtempSync(join(tmpdir(), "warren-ready-wait-"));
  const containersWith = (timing: { readyTimeoutMs: number; readyPollMs?: number }) =>
    new InstanceContainers({
      instance: "readywait",
      crunRoot: dir,
      records: { dir: () => dir } as unknown as InstanceRecords,
      uidBase: 0,
      nodeBinary: process.execPath,
      envdRoot: dir,
      disks: undefined as never,
      ...timing,
    });
  const containers = containersWith({ readyTimeoutMs: TIMEOUT_MS });

  beforeAll(async () => {
    cgroups = detectCgroupManager(PARENT);
    await cgroups.prepare();
    await cgroups.open(NAME).remove();
  });

  afterEach(async () => {
    child?.kill("SIGKILL");
    child = undefined;
    await cgroup?.killAll();
    await cgroup?.remove();
    await new Promise((resolve) => (envd ? envd.close(resolve) : resolve(undefined)));
    envd = undefined;
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** A sandbox whose only process runs `script` in its cgroups (a tenth of a core), as the launcher places it. */
  async function sandbox(script: string): Promise<InstanceRecord> {
    cgroup = await cgroups.create(NAME, { cpuCount: 0.1, memoryMB: 256, diskSizeMB: 64, pidsMax: 16 });
    const procs = cgroup.procsFiles.map((f) => `echo $$ > ${f}`).join("; ");
    child = spawn("sh", ["-c", `${procs}; exec sh -c "$0"`, script], { stdio: "ignore" });
    const pid = child.pid ?? 0;
    // Until it has joined: CPU it used before counts in the host's cgroup, not the sandbox's.
    for (let i = 0; i < 100 && (await cgroup.pids()).length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    return {
      instanceId: NAME,
      addr: ADDR,
      pid,
      pidStartTime: await processStartTime(pid),
    } as InstanceRecord;
  }

  function envdAfter(ms: number): void {
    setTimeout(() => {
      envd = createServer((_req, res) => res.end("ok")).listen(ENVD_PORT, ADDR);
    }, ms);
  }

  it("a start that sits idle fails at the timeout, saying how little CPU it used", async () => {
    const record = await sandbox("sleep 60");
    const started = Date.now();
    await expect(containers.waitReady(record, cgroup, silentLogger)).rejects.toThrow(
      /^envd did not answer within \d+ ms \(the sandbox used \d ms of CPU in its last \d+ ms\)$/,
    );
    expect(Date.now() - started).toBeLessThan(TIMEOUT_MS * 3);
  });

  it("a start still using CPU at the timeout waits on, and is ready once envd answers", async () => {
    const record = await sandbox("while :; do :; done");
    envdAfter(TIMEOUT_MS * 2.5);
    const started = Date.now();
    await containers.waitReady(record, cgroup, silentLogger);
    expect(Date.now() - started).toBeGreaterThan(TIMEOUT_MS * 2);
  });

  it("a start that uses CPU for ever fails at three times the timeout", async () => {
    const record = await sandbox("while :; do :; done");
    const started = Date.now();
    await expect(containers.waitReady(record, cgroup, silentLogger)).rejects.toThrow(
      /^envd did not answer within \d+ ms \(the sandbox used \d+ ms of CPU in its last \d+ ms\)$/,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(TIMEOUT_MS * 3);
    expect(Date.now() - started).toBeLessThan(TIMEOUT_MS * 4);
  });

  it("asks envd again as soon as the sandbox's log changes, not only at the next poll", async () => {
    // Polls ten seconds apart: only the log's change can make the wait end within the test's few seconds.
    const slowPolls = containersWith({ readyTimeoutMs: 30_000, readyPollMs: 10_000 });
    writeFileSync(join(dir, "envd.log"), "");
    const record = await sandbox("sleep 60");
    setTimeout(() => {
      envd = createServer((_req, res) => res.end("ok")).listen(ENVD_PORT, ADDR, () => {
        appendFileSync(join(dir, "envd.log"), '{"msg":"envd listening"}\n');
      });
    }, 300);
    const started = Date.now();
    await slowPolls.waitReady(record, cgroup, silentLogger);
    expect(Date.now() - started).toBeLessThan(5_000);
    rmSync(join(dir, "envd.log"));
  });

  it("a sandbox that exits while starting fails at once", async () => {
    const record = await sandbox("sleep 0.3");
    await expect(containers.waitReady(record, cgroup, silentLogger)).rejects.toThrow(
      /^sandbox exited before envd answered/,
    );
  });
});
