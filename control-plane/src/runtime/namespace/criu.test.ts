import { chmod, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { criuDeadlineMs, criuDump, criuRestore } from "./criu.js";
import { BOOT_ID, RESOLV_CONF } from "./instance-container.js";

// A stand-in criu that records its arguments (and, for a restore, writes the pid file CRIU would): the seam between
// the dump of one instance and the restore into another, checked on any host, CRIU or not. The memory path itself
// runs against the real CRIU in the whole-cluster tests where the host has it.
const fakeCriu = (argsPrefix: string) => `#!/bin/sh
printf '%s\\n' "$@" > "${argsPrefix}.$1"
readlink /proc/$$/fd/4 > "${argsPrefix}.$1.fd4" || true
readlink /proc/$$/fd/5 > "${argsPrefix}.$1.fd5" || true
prev=""
for arg in "$@"; do
  if [ "$prev" = "--pidfile" ]; then echo $$ > "$arg"; fi
  prev="$arg"
done
`;

function mappings(args: string[]): Map<string, string> {
  const map = new Map<string, string>();
  args.forEach((arg, i) => {
    if (arg !== "--ext-mount-map" || args[i + 1] === "auto") return;
    const value = args[i + 1] ?? "";
    const colon = value.indexOf(":");
    map.set(value.slice(0, colon), value.slice(colon + 1));
  });
  return map;
}

describe("criu dump and restore name the instance's own files the same way", () => {
  let dir = "";
  let criu = "";
  const argsOf = async (command: string) =>
    (await readFile(join(dir, `args.${command}`), "utf8")).split("\n").filter(Boolean);

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "warren-criu-args-"));
    criu = join(dir, "criu");
    await writeFile(criu, fakeCriu(join(dir, "args")));
    await chmod(criu, 0o755);
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("a restore into another instance maps resolv.conf and the boot id to that instance's files", async () => {
    await criuDump({
      criu,
      netnsPath: "/proc/self/ns/net",
      pid: process.pid,
      imagesDir: join(dir, "images"),
      freezerDir: join(dir, "freezer"),
      logFileKey: "file[1:2]",
      workloadFileKey: "file[1:3]",
      workloadOomFileKey: "file[1:4]",
      leaveRunning: true,
      instanceFiles: [RESOLV_CONF, BOOT_ID],
      deadlineMs: 10_000,
    });
    const dump = await argsOf("dump");
    // The host files the tree holds are external: envd.log and the workload cgroup's two descriptors.
    expect(dump.join(" ")).toContain("--external file[1:2] --external file[1:3] --external file[1:4]");
    // Named by their path in the sandbox, not by the source instance's host path (CRIU 4's `auto` key).
    expect(mappings(dump)).toEqual(
      new Map([
        [RESOLV_CONF, RESOLV_CONF],
        [BOOT_ID, BOOT_ID],
      ]),
    );
    expect(dump).toContain("--skip-in-flight");

    const target = {
      resolv: join(dir, "other", "resolv.conf"),
      bootId: join(dir, "other", "boot_id"),
      workload: join(dir, "workload.procs"),
      oom: join(dir, "workload.oom_control"),
    };
    await writeFile(target.workload, "");
    await writeFile(target.oom, "oom_kill 0\n");
    await criuRestore({
      criu,
      netnsPath: "/proc/self/ns/net",
      procsFiles: [],
      imagesDir: join(dir, "images"),
      workDir: join(dir, "other"),
      rootfs: join(dir, "other", "rootfs"),
      logPath: join(dir, "envd.log"),
      logFileKey: "file[1:2]",
      workload: {
        fileKey: "file[1:3]",
        procsFile: target.workload,
        oom: { fileKey: "file[1:4]", file: target.oom },
      },
      uid: process.getuid?.() ?? 0,
      instanceFiles: { [RESOLV_CONF]: target.resolv, [BOOT_ID]: target.bootId },
      deadlineMs: 10_000,
    });
    // The restored tree gets the target instance's workload descriptor (opened here, as host root) in its place:
    // named so CRIU duplicates it rather than reopens it with the sandbox's credentials (duplicatedFileKey; the
    // real CRIU's side runs in e2e/test/snapshots.test.ts). envd's log is reopened (the sandbox owns it).
    expect((await argsOf("restore")).join(" ")).toContain(
      "--inherit-fd fd[3]:file[1:2] --inherit-fd fd[4]:ile[1:3] --inherit-fd fd[5]:ile[1:4]",
    );
    expect((await readFile(join(dir, "args.restore.fd4"), "utf8")).trim()).toBe(target.workload);
    expect((await readFile(join(dir, "args.restore.fd5"), "utf8")).trim()).toBe(target.oom);
    const restore = mappings(await argsOf("restore"));
    for (const [mountpoint, name] of mappings(dump)) {
      expect(restore.get(name), `the restore maps ${mountpoint}`).toBe(
        mountpoint === RESOLV_CONF ? target.resolv : target.bootId,
      );
    }
  });
});

describe("a criu that hangs (as inside its parasite on one PVM host) is killed at its deadline", () => {
  let dir = "";
  let criu = "";

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "warren-criu-hang-"));
    criu = join(dir, "criu");
    // exec: the sleep is the process the caller spawned, so the kill reaches it (as it reaches the real criu).
    await writeFile(criu, `#!/bin/sh\necho "$$" > "${join(dir, "pid")}.$1"\nexec sleep 600\n`);
    await chmod(criu, 0o755);
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const alive = async (command: string) => {
    const pid = Number((await readFile(join(dir, `pid.${command}`), "utf8")).trim());
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };

  it("dump and restore fail with a message saying so, and leave no criu behind", async () => {
    const dump = criuDump({
      criu,
      netnsPath: "/proc/self/ns/net",
      pid: process.pid,
      imagesDir: join(dir, "images"),
      freezerDir: join(dir, "freezer"),
      logFileKey: "file[1:2]",
      instanceFiles: [RESOLV_CONF, BOOT_ID],
      deadlineMs: 300,
    });
    await expect(dump).rejects.toThrow(/criu dump did not finish within 300 ms \(killed\)/);
    expect(await alive("dump")).toBe(false);

    const restore = criuRestore({
      criu,
      netnsPath: "/proc/self/ns/net",
      procsFiles: [],
      imagesDir: join(dir, "images"),
      workDir: join(dir, "work"),
      rootfs: join(dir, "rootfs"),
      logPath: join(dir, "envd.log"),
      logFileKey: "file[1:2]",
      uid: process.getuid?.() ?? 0,
      instanceFiles: {},
      deadlineMs: 300,
    });
    await expect(restore).rejects.toThrow(/criu restore did not finish within 300 ms \(killed\)/);
    expect(await alive("restore")).toBe(false);
  });

  it("gives bigger sandboxes more time", () => {
    expect(criuDeadlineMs(0)).toBe(30_000);
    expect(criuDeadlineMs(512 * 2 ** 20)).toBe(90_000);
  });
});
