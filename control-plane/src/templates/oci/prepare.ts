import { chmod, lchown, lstat, readdir, unlink } from "node:fs/promises";
import { join } from "node:path";
import { ensureSandboxAccount, type SandboxAccount } from "./accounts.js";
import { installEnvdRuntime } from "./envd-runtime.js";
import { Rootfs } from "./rootfs-path.js";

/** Ids in an image are below this; the sandbox user namespace maps this many ids (instance-container.ts). */
const ID_COUNT = 65536;
/** Where an id outside 0..65535 goes: `nobody` in the sandbox. */
const NOBODY = 65534;
/** The PATH the driver gives envd (instance-container.ts), where tools are looked up. */
const PATH_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
/** Programs E2B users and their ready checks expect (the `base` template has them); reported, never installed. */
const EXPECTED_TOOLS = ["sudo", "curl", "ss", "pgrep", "inotifywait", "git", "python3"];

const LIBC_NOTE: Readonly<Record<PreparedRootfs["libc"], string>> = {
  image: "envd runs on the image's own GNU libc",
  host: "image has no GNU libc: envd runs on the host's glibc, copied to /lib64 and /lib/<arch>-linux-gnu",
  none: "envd runs on a static node: no libc needed",
};

const HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n";

export interface PrepareOptions {
  readonly imageName: string;
  /** The namespace driver's uid shift (node agent's WARREN_UID_BASE). */
  readonly uidBase: number;
  /** The host binary the driver bind-mounts at /opt/warren/bin/node. */
  readonly nodeBinary: string;
  /** The directory the driver bind-mounts envd, its proto and node_modules from (node agent's envdRoot). */
  readonly envdRoot: string;
  readonly onLog?: (line: string) => void;
}

export interface PreparedRootfs {
  /** Whose glibc envd's node loads: the image's own, or the host's copied into the image. */
  readonly libc: "image" | "host" | "none";
  /** Files copied from the host (tini, setpriv, bash, the glibc loader and libraries), as paths in the image. */
  readonly added: readonly string[];
  readonly user: SandboxAccount;
  /** Of EXPECTED_TOOLS, those the image does not have: sandboxes work, but commands using them fail. */
  readonly missingTools: readonly string[];
  /** Size of the rootfs (regular files, each inode once). */
  readonly bytes: number;
}

/**
 * Turns an unpacked image into a rootfs the namespace driver starts sandboxes from, as from the `base` template
 * (catalog.ts BASE_SETUP): envd's runtime (envd-runtime.ts), `user` with a home and sudo when the image has it,
 * the driver's bind-mount points (/opt/warren/{envd,proto,node_modules,bin/node}, /usr/local/bin/node), the per-sandbox
 * /etc/hosts, /etc/hostname and an empty /etc/resolv.conf, then every owner shifted into the sandbox uid range.
 * Nothing from the image is executed: every step is a file operation from the host, confined to the rootfs.
 */
export async function prepareRootfs(rootfs: string, options: PrepareOptions): Promise<PreparedRootfs> {
  const log = options.onLog ?? (() => undefined);
  const image = new Rootfs(rootfs);
  const runtime = await installEnvdRuntime(image, options);
  log(LIBC_NOTE[runtime.libc]);
  if (runtime.added.length > 0) log(`copied from the host: ${runtime.added.join(", ")}`);
  const user = await ensureSandboxAccount(image, "/bin/bash");
  log(
    `${user.created ? "created" : "kept the image's"} user 'user' (uid ${user.uid}, home ${user.home})${user.sudo ? " with passwordless sudo" : ", no sudo in the image"}`,
  );
  await writeMountPoints(image);
  const missingTools = await missing(image, EXPECTED_TOOLS);
  if (missingTools.length > 0) log(`not in the image (commands using them fail): ${missingTools.join(", ")}`);
  const { bytes, devices } = await shiftImageOwners(image.root, options.uidBase);
  if (devices.length > 0) {
    const some = devices.slice(0, 10).join(", ");
    log(
      `removed ${devices.length} device nodes (sandboxes get their own /dev): ${some}${devices.length > 10 ? ", …" : ""}`,
    );
  }
  return { libc: runtime.libc, added: runtime.added, user, missingTools, bytes };
}

async function writeMountPoints(image: Rootfs): Promise<void> {
  for (const dir of ["/opt/warren/envd", "/opt/warren/proto", "/opt/warren/node_modules", "/proc", "/sys", "/dev"]) {
    await image.mkdir(dir, 0o755);
  }
  await chmod(await image.mkdir("/tmp", 0o1777), 0o1777);
  const root = await image.resolve("/root");
  if (!(await lstat(root).catch(() => undefined))) await image.mkdir("/root", 0o700);
  // envd's node (the host's) is bound over /opt/warren/bin/node; the sandbox's `node` is the image's own where it
  // has one (node:22 images), else the host's bound over an empty placeholder.
  await image.mkdir("/opt/warren/bin", 0o755);
  await image.writeFile("/opt/warren/bin/node", "", 0o755);
  if (!(await image.stat("/usr/local/bin/node"))?.isFile()) await image.writeFile("/usr/local/bin/node", "", 0o755);
  await image.writeFile("/etc/hostname", "sandbox\n");
  await image.writeFile("/etc/hosts", HOSTS);
  // Bound per sandbox (the node's DNS gateway); a symlink here (systemd-resolved) would redirect the bind.
  await image.writeFile("/etc/resolv.conf", "");
}

async function missing(image: Rootfs, tools: readonly string[]): Promise<string[]> {
  const absent: string[] = [];
  for (const tool of tools) {
    let found = false;
    for (const dir of PATH_DIRS) if (!found && (await image.isExecutable(`${dir}/${tool}`))) found = true;
    if (!found) absent.push(tool);
  }
  return absent;
}

/**
 * Moves owners into the sandbox range, as uid-shift.ts does for built templates: id n < 65536 → base + n. Unlike
 * a template build, an image may carry ids of 65536 and more, which the sandbox cannot map: they become `nobody`.
 * Ids already in base..base+65535 are a second link to an inode shifted before and stay. chown clears setuid bits,
 * so the mode is put back. Device nodes are deleted: an image's `/home/x/sda` (block 8,0) would otherwise be a
 * handle on a host disk in a lower layer that is not mounted nodev. Returns the size of the regular files (each
 * inode once) and the deleted device nodes (paths in the image).
 */
export async function shiftImageOwners(root: string, base: number): Promise<{ bytes: number; devices: string[] }> {
  let bytes = 0;
  const devices: string[] = [];
  const seen = new Set<string>();
  const shift = (id: number) => (id >= base && id < base + ID_COUNT ? id : base + (id < ID_COUNT ? id : NOBODY));
  const visit = async (path: string): Promise<void> => {
    const st = await lstat(path);
    if (st.isBlockDevice() || st.isCharacterDevice()) {
      await unlink(path);
      devices.push(path.slice(root.length) || "/");
      return;
    }
    const uid = shift(st.uid);
    const gid = shift(st.gid);
    if (uid !== st.uid || gid !== st.gid) {
      await lchown(path, uid, gid);
      if (!st.isSymbolicLink() && st.mode & 0o6000) await chmod(path, st.mode & 0o7777);
    }
    if (st.isFile()) {
      const inode = `${st.dev}:${st.ino}`;
      if (st.nlink === 1 || !seen.has(inode)) bytes += st.size;
      if (st.nlink > 1) seen.add(inode);
    }
    if (st.isDirectory()) {
      const entries = await readdir(path);
      for (let i = 0; i < entries.length; i += 32) {
        await Promise.all(entries.slice(i, i + 32).map((name) => visit(join(path, name))));
      }
    }
  };
  await visit(root);
  return { bytes, devices };
}
