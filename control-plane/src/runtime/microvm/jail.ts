import { spawnSync } from "node:child_process";
import { chown, copyFile, link, mkdir, readFile, readlink, rename, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";

/**
 * QEMU's jail (qemu.ts launches with it): the arguments that make QEMU chroot into its instance directory and drop
 * to a uid of its own, what the chroot holds, and migrations written from inside it.
 */

/** The unprivileged identity a QEMU runs as: one of its own per sandbox (network.ts `qemuUid`). */
export interface VmJail {
  readonly uid: number;
  readonly gid: number;
}

export type JailSyntax = "runas-chroot" | "run-with-chroot" | "run-with";

/**
 * How this QEMU spells "drop privileges and chroot": QEMU 7.2 (Debian 12) has `-runas` and `-chroot`; 8.1 moved
 * chroot to `-run-with chroot=`, 9.1 added `-run-with user=` (and later QEMUs drop the old options). Read once
 * from `-help`.
 */
let jailSyntax: JailSyntax | undefined;
export function qemuJailSyntax(): JailSyntax {
  if (jailSyntax === undefined) {
    const help = spawnSync("qemu-system-x86_64", ["-help"], { encoding: "utf8", timeout: 10_000 }).stdout ?? "";
    const runWith = /^-run-with .*$/m.exec(help)?.[0] ?? "";
    jailSyntax = runWith.includes("user=")
      ? "run-with"
      : runWith.includes("chroot=")
        ? "run-with-chroot"
        : "runas-chroot";
  }
  return jailSyntax;
}

/**
 * QEMU's own jail, in the spirit of Firecracker's jailer: after opening everything it needs as root (kernel,
 * disks and their backing chain, tap, /dev/kvm, sockets, the incoming memory fd, its seccomp filter), QEMU
 * chroots into the instance directory and becomes the sandbox's own uid/gid with no capabilities (real, effective
 * and saved ids all change, so there is no way back to root even though seccomp's `elevateprivileges=deny` cannot
 * be used: QEMU installs the filter before it drops privileges, so the filter would kill the drop itself). A
 * guest that escapes into QEMU then holds a process that owns nothing on the host, sees only its instance
 * directory (its own disk layer and logs, root-owned), cannot signal or trace another sandbox's QEMU (another
 * uid), and is still confined by its cgroup, network namespace and seccomp filter.
 */
export function jailArgs(dir: string, jail: VmJail, syntax: JailSyntax): string[] {
  const user = `${jail.uid}:${jail.gid}`;
  switch (syntax) {
    case "run-with":
      return ["-run-with", `chroot=${dir},user=${user}`];
    case "run-with-chroot":
      return ["-run-with", `chroot=${dir}`, "-runas", user];
    case "runas-chroot":
      return ["-chroot", dir, "-runas", user];
  }
}

/**
 * What a jailed QEMU needs inside its chroot `dir`: its disk layer, owned by its uid (QEMU reopens it by its
 * relative name, see qemu.ts diskPath); `exec:` migration (QEMU 7.2 has no `file:` URI) runs
 * `/bin/sh -c "cat > ..."`, so `bin/sh` and `bin/cat` are a static busybox (Debian's busybox-static, root-owned,
 * hard-linked where the filesystem allows). Nothing else of the host is in there.
 */
export async function prepareJail(dir: string, disk: string, jail: VmJail): Promise<void> {
  if (dirname(disk) !== dir) throw new Error(`a jailed VM's disk must be in its directory: ${disk}`);
  await chown(disk, jail.uid, jail.gid);
  const bin = join(dir, "bin");
  await mkdir(bin, { recursive: true, mode: 0o755 });
  for (const name of ["sh", "cat"]) {
    const target = join(bin, name);
    await rm(target, { force: true });
    await link(STATIC_BUSYBOX, target).catch(() => copyFile(STATIC_BUSYBOX, target));
  }
}

const STATIC_BUSYBOX = "/bin/busybox";

export interface MigrationTarget {
  /** The file as QEMU's shell names it. */
  readonly uri: string;
  /** Moves the written file to where the caller wants it, root-owned. */
  finish(): Promise<void>;
  /** Removes what is left of a failed migration (nothing after `finish`). */
  discard(): Promise<void>;
}

export async function migrationTarget(vmDir: string, path: string): Promise<MigrationTarget> {
  const jail = await jailOf(vmDir);
  if (!jail) return { uri: path, finish: async () => undefined, discard: async () => undefined };
  const inJail = join(vmDir, "migrate.out");
  await rm(inJail, { force: true });
  await writeFile(inJail, "", { mode: 0o600 });
  await chown(inJail, jail.uid, jail.gid);
  let moved = false;
  return {
    uri: "/migrate.out",
    finish: async () => {
      await chown(inJail, 0, 0);
      await rename(inJail, path).catch(async () => {
        await copyFile(inJail, path);
        await rm(inJail, { force: true });
      });
      moved = true;
    },
    discard: async () => {
      if (!moved) await rm(inJail, { force: true });
    },
  };
}

/**
 * The uid/gid of the QEMU whose directory is `vmDir`, when it runs jailed there (its root is that directory). A
 * QEMU started before jails existed (re-adopted after an agent upgrade) is not: its migration writes `path`
 * directly, as before.
 */
async function jailOf(vmDir: string): Promise<VmJail | undefined> {
  const pid = Number((await readFile(join(vmDir, "qemu.pid"), "utf8").catch(() => "")).trim());
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const root = await readlink(`/proc/${pid}/root`).catch(() => "");
  if (root !== vmDir) return undefined;
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
  const gid = Number(/^Gid:\s+(\d+)/m.exec(status)?.[1]);
  return Number.isInteger(uid) && Number.isInteger(gid) ? { uid, gid } : undefined;
}
