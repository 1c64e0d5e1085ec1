import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import {
  chmod,
  copyFile,
  lchown,
  lstat,
  mkdir,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { join } from "node:path";
import type { TemplateImage } from "../driver.js";
import { envdLauncherPath, exec } from "../exec.js";
import { withFileLock } from "../file-lock.js";
import { CODE_GATEWAY_PORT, ENVD_PORT } from "../sandbox-process.js";

/**
 * What a microVM boots, built on the node and cached by content hash under `<dir>` (like templates):
 * - the guest kernel: Debian's cloud kernel (unpacked by scripts/setup-host.sh), turned into the ELF `vmlinux`
 *   that QEMU boots by PVH (the bzImage's decompressor is slow and hung under PVM; RUNTIME-NOTES §3.1);
 * - a 1.2 MB initramfs: static busybox + the virtio modules (=m in Debian's kernels) + `/init`, which loads them,
 *   mounts `/dev/vda` and switch_roots to the guest init; with `warren.mode=probe` it only prints a marker and
 *   powers off (the capability probe's "tiny guest");
 * - a root image per template: the template's rootfs with owners shifted back (templates are stored shifted into
 *   the namespace driver's uid range), node, envd's bundle, its launcher and its two native addons, and the guest
 *   init, as an ext4 image with room for the sandbox's writable data.
 */

/** Guest side of the per-sandbox network (fixed, so one snapshot serves every sandbox; see network.ts). */
export const GUEST_ADDR = "192.168.127.2";
export const GUEST_GATEWAY = "192.168.127.1";
export const GUEST_MAC = "02:00:00:00:00:02";
export const TAP_MAC = "02:00:00:00:00:01";
export { CODE_GATEWAY_PORT, ENVD_PORT };

const MODULES = [
  "drivers/virtio/virtio_ring",
  "drivers/virtio/virtio",
  "drivers/virtio/virtio_mmio",
  "drivers/block/virtio_blk",
  "net/core/failover",
  "drivers/net/net_failover",
  "drivers/net/virtio_net",
];

const INITRAMFS_INIT = `#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in ${MODULES.map((m) => m.split("/").pop()).join(" ")}; do $B insmod /lib/modules/$m.ko; done
mode=; rinit=/opt/warren/init
for a in $($B cat /proc/cmdline); do
  case "$a" in warren.mode=*) mode=\${a#*=};; warren.init=*) rinit=\${a#*=};; esac
done
if [ "$mode" = probe ]; then
  echo "WARREN-PROBE-OK uptime=$($B cut -d' ' -f1 /proc/uptime)"
  $B poweroff -f
fi
i=0
while [ ! -b /dev/vda ] && [ $i -lt 1000 ]; do $B usleep 10000; i=$((i+1)); done
if ! $B mount -t ext4 -o rw,noatime /dev/vda /newroot; then echo "WARREN-BOOT-FAIL no root"; $B poweroff -f; fi
$B mount --move /dev /newroot/dev
$B umount /proc /sys
exec $B switch_root /newroot "$rinit"
`;

/**
 * The guest's init (PID 1 until it execs tini): mounts, hostname, the fixed guest address with a default route
 * via the tap (what may leave is the namespace's to decide, egress.ts) and a resolv.conf naming the tap (the
 * namespace sends DNS to the node's gateway whatever it names), the clock listener, then tini → envd. A guest restored from a snapshot (or continued after a pause) wakes up with the wall time of
 * the moment it stopped: QEMU keeps guest time continuous. Left alone, the clock would jump later, and a jump
 * under a running request breaks deadlines computed from wall time (connect-es computes a handler's remaining
 * timeout from Date.now(): a forward jump made envd kill a fresh command at once). So the driver sets the clock
 * before it hands the sandbox out: it writes `warren-clock <epoch>` to the serial console after every `cont`, and
 * this listener (blocked in read(), no cost while idle) sets the time and acknowledges. After a restore the line
 * also carries 32 random bytes from the host: every restore of a snapshot starts with the same kernel CRNG state,
 * so the listener credits them to the input pool (RNDADDENTROPY) and forces a reseed (RNDRESEEDCRNG), through
 * perl (Debian's perl-base is essential: in every Debian template; without it the bytes are only written to
 * /dev/urandom, which mixes them in at the next scheduled reseed), and says which in its acknowledgement.
 * Firecracker documents the same step for its clones. `warren-stop <n>` is the
 * shutdown before a filesystem-only pause: the page cache goes to the disk the reboot will mount, then every
 * process gets SIGTERM, so the guest's kernel closes their connections with a FIN (clients drop them instead of
 * reusing them after the reboot, where they would meet a RST). envd's exit ends tini, PID 1, and the kernel
 * panics ("Attempted to kill init", in the console log) and QEMU exits (`panic=1`, `-no-reboot`).
 */
function guestInit(codeGateway: boolean): string {
  return `#!/opt/warren/busybox sh
B=/opt/warren/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
$B mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
$B mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run
$B hostname sandbox
$B ip link set lo up
$B ip addr add ${GUEST_ADDR}/30 dev eth0
$B ip link set eth0 up
$B ip route add default via ${GUEST_GATEWAY} dev eth0
$B rm -f /etc/resolv.conf
printf 'nameserver ${GUEST_GATEWAY}\noptions timeout:2 attempts:2\n' > /etc/resolv.conf
$B hwclock -s -u 2>/dev/null
$B stty -F /dev/ttyS0 -echo
RESEED='open(my $f, "+<", "/dev/urandom") or exit 1; my $s = pack("H*", $ARGV[0]);
ioctl($f, 0x40085203, pack("i i", 8 * length($s), length($s)) . $s) or exit 1; ioctl($f, 0x5207, 0) or exit 1;'
(
  trap '' TERM
  while read -r cmd arg seed; do
    case "$cmd" in
      warren-clock)
        $B date -u -s "@$arg" >/dev/null 2>&1 || continue
        how=""
        if [ -n "$seed" ]; then
          if [ -x /usr/bin/perl ] && /usr/bin/perl -e "$RESEED" "$seed" 2>/dev/null; then how=reseeded
          else printf '%s' "$seed" > /dev/urandom; how=mixed; fi
        fi
        echo "WARREN-CLOCK-SET $arg $how" > /dev/ttyS0 ;;
      warren-stop) $B sync; echo "WARREN-STOPPED $arg" > /dev/ttyS0; $B kill -TERM -1 ;;
    esac
  done
) </dev/ttyS0 >/dev/null 2>&1 &
${codeGateway ? CODE_GATEWAY_START : ""}echo "WARREN-GUEST-INIT envd starting"
exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \\
  /usr/bin/tini -g -- /usr/local/bin/node \\
  /opt/warren/envd/dist/envd.cjs --host 0.0.0.0 --port ${ENVD_PORT} --default-user user --expose-loopback
`;
}

/**
 * Code templates: the code gateway (port 49999) next to envd, as the namespace driver runs it (SANDBOX_INIT in
 * ../namespace/instance-container.ts: same settings, same restart loop), started by the guest init before it
 * becomes tini: in a session of its own (tini's signals to envd's process group do not reach it), re-parented to tini, which reaps
 * it. Its settings go to its environment only; envd and what envd starts never see them. Deadlines on envd's
 * token check and a kernel's start are wider than the gateway's defaults: under TCG (software emulation) Node's
 * first `fetch` and a Python kernel's imports take many times longer than on a real CPU.
 */
const CODE_GATEWAY_START = `$B setsid /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
  HOME=/root LANG=C.UTF-8 CODE_GATEWAY_HOST=0.0.0.0 CODE_GATEWAY_PORT=${CODE_GATEWAY_PORT} \\
  CODE_GATEWAY_ENVD_URL=http://127.0.0.1:${ENVD_PORT} CODE_GATEWAY_AUTH=envd \\
  CODE_GATEWAY_NODE=/usr/local/bin/node CODE_GATEWAY_PYTHON=/usr/bin/python3 \\
  CODE_GATEWAY_ENVD_TIMEOUT_MS=15000 CODE_GATEWAY_KERNEL_START_TIMEOUT_MS=180000 \\
  /bin/sh -c 'while :; do /usr/local/bin/node /opt/warren/code-gateway/dist/main.js; sleep 1; done' \\
  </dev/null &
`;

export interface GuestKernel {
  readonly vmlinux: string;
  readonly initramfs: string;
  readonly version: string;
}

export interface GuestImageOptions {
  /** Cache root (default /var/lib/warren/microvm). */
  readonly dir: string;
  /** Unpacked Debian kernel package: `boot/vmlinuz-*` and `lib/modules/<version>/`. */
  readonly linuxDir: string;
  readonly busybox: string;
  readonly nodeBinary: string;
  /** Repository root: envd/dist/ (its launcher, bundle and code cache) and node_modules/. */
  readonly envdRoot: string;
  readonly uidBase: number;
}

const ENVD_FILES = ["envd.cjs", "envd-main.cjs", "envd-main.cjs.cache"];
const ADDONS = ["@lydell/node-pty", "@lydell/node-pty-linux-x64", "fs-xattr"];
/** What of code-gateway/ a code template's guest needs (the namespace driver bind-mounts the same). */
const CODE_GATEWAY_FILES = ["dist", "python", "package.json"];

function sha(...parts: (string | Buffer)[]): string {
  const hash = createHash("sha256");
  for (const part of parts) hash.update(part);
  return hash.digest("hex").slice(0, 16);
}

/** The kernel version of the unpacked package (the name of its only `boot/vmlinuz-*`). */
export async function kernelVersion(linuxDir: string): Promise<string> {
  const names = (await readdir(join(linuxDir, "boot"))).filter((n) => n.startsWith("vmlinuz-"));
  if (names.length !== 1) throw new Error(`expected one vmlinuz in ${linuxDir}/boot, found ${names.length}`);
  return names[0]!.slice("vmlinuz-".length);
}

/** Builds (once) the PVH-bootable vmlinux and the initramfs. */
export async function ensureKernel(options: GuestImageOptions): Promise<GuestKernel> {
  const version = await kernelVersion(options.linuxDir);
  const key = sha(version, INITRAMFS_INIT, MODULES.join(","), String((await stat(options.busybox)).size));
  const dir = join(options.dir, "kernel", `${version}-${key}`);
  const result = { vmlinux: join(dir, "vmlinux"), initramfs: join(dir, "initramfs.cpio.gz"), version };
  if (existsSync(join(dir, "READY"))) return result;
  return withFileLock(join(options.dir, "locks", "kernel.lock"), async () => {
    if (existsSync(join(dir, "READY"))) return result;
    const tmp = `${dir}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(join(tmp, "initrd", "bin"), { recursive: true });
    try {
      // Debian's vmlinuz is a bzImage whose payload is LZ4 (frame magic 02 21 4c 18); unpacked it is the ELF
      // with the PVH entry note.
      const bz = await readFile(join(options.linuxDir, "boot", `vmlinuz-${version}`));
      const at = bz.indexOf(Buffer.from([0x02, 0x21, 0x4c, 0x18]));
      if (at < 0) throw new Error(`no LZ4 payload in vmlinuz-${version}`);
      await writeFile(join(tmp, "k.lz4"), bz.subarray(at));
      // lz4 exits non-zero on the bzImage's trailing bytes; the ELF check below is what counts.
      await exec("sh", [
        "-c",
        'lz4 -dc "$1" > "$2" 2>/dev/null || true',
        "lz4",
        join(tmp, "k.lz4"),
        join(tmp, "vmlinux"),
      ]);
      const head = await readFile(join(tmp, "vmlinux")).then((b) => b.subarray(0, 4));
      if (!head.equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46]))) throw new Error("unpacked kernel is not an ELF");
      await rm(join(tmp, "k.lz4"));
      const initrd = join(tmp, "initrd");
      for (const d of ["dev", "proc", "sys", "newroot", "lib/modules"])
        await mkdir(join(initrd, d), { recursive: true });
      await copyFile(options.busybox, join(initrd, "bin", "busybox"));
      await chmod(join(initrd, "bin", "busybox"), 0o755);
      for (const m of MODULES) {
        const source = join(options.linuxDir, "lib", "modules", version, "kernel", `${m}.ko`);
        await copyFile(source, join(initrd, "lib", "modules", `${m.split("/").pop()}.ko`));
      }
      await writeFile(join(initrd, "init"), INITRAMFS_INIT, { mode: 0o755 });
      await exec("sh", [
        "-c",
        'cd "$1" && find . | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2"',
        "cpio",
        initrd,
        join(tmp, "initramfs.cpio.gz"),
      ]);
      await rm(initrd, { recursive: true });
      await writeFile(join(tmp, "READY"), new Date().toISOString());
      await rm(dir, { recursive: true, force: true });
      await mkdir(join(options.dir, "kernel"), { recursive: true });
      await rename(tmp, dir);
      return result;
    } catch (error) {
      await rm(tmp, { recursive: true, force: true });
      throw error;
    }
  });
}

export interface RootImage {
  readonly path: string;
  /** Content hash (template, envd, node, guest init, size): snapshots are keyed by it. */
  readonly key: string;
  readonly sizeBytes: number;
}

/** Builds (once per content hash) the template's ext4 root image with envd and the guest init inside. */
export async function ensureRootImage(
  options: GuestImageOptions,
  template: TemplateImage,
  diskSizeMB: number,
): Promise<RootImage> {
  const envdDist = join(options.envdRoot, "envd", "dist");
  // The launcher, the bundle and its code cache (when the build wrote one: src/launcher.ts in envd).
  const envdFiles = ENVD_FILES.filter((name) => existsSync(join(envdDist, name)));
  // envd's static command launcher (envd/native/warren-exec.c), beside the bundle as envd expects it.
  const launcher = envdLauncherPath(options.envdRoot);
  const hasLauncher = existsSync(launcher);
  const node = await stat(options.nodeBinary);
  const codeGateway = template.codeGateway === true;
  const gatewayDir = join(options.envdRoot, "code-gateway");
  const key = sha(
    template.templateId,
    template.hash,
    ...(await Promise.all(envdFiles.map(async (name) => `${name}:${sha(await readFile(join(envdDist, name)))}`))),
    hasLauncher ? await readFile(launcher) : "",
    `${options.nodeBinary}:${node.size}:${node.mtimeMs}`,
    guestInit(codeGateway),
    // The gateway's own files and the workspace packages it imports (copied below with its other dependencies).
    codeGateway
      ? await treeDigest([
          ...CODE_GATEWAY_FILES.map((name) => join(gatewayDir, name)),
          join(options.envdRoot, "platform", "dist"),
          join(options.envdRoot, "proto", "dist"),
        ])
      : "",
    String(diskSizeMB),
    String(options.uidBase),
  );
  const dir = join(options.dir, "images", `${template.templateId}-${key}`);
  const path = join(dir, "rootfs.ext4");
  const ready = async (): Promise<RootImage> => ({ path, key, sizeBytes: (await stat(path)).size });
  if (existsSync(join(dir, "READY"))) return ready();
  return withFileLock(join(options.dir, "locks", `image-${template.templateId}.lock`), async () => {
    if (existsSync(join(dir, "READY"))) return ready();
    const tmp = `${dir}.tmp-${process.pid}`;
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true });
    const root = join(tmp, "root");
    try {
      await exec("cp", ["-a", "--reflink=auto", template.rootfs, root]);
      await unshiftOwners(root, options.uidBase);
      await copyFile(options.nodeBinary, join(root, "usr", "local", "bin", "node"));
      await chmod(join(root, "usr", "local", "bin", "node"), 0o755);
      await mkdir(join(root, "opt", "warren", "envd", "dist"), { recursive: true });
      for (const name of envdFiles)
        await copyFile(join(envdDist, name), join(root, "opt", "warren", "envd", "dist", name));
      if (hasLauncher) {
        await copyFile(launcher, join(root, "opt", "warren", "envd", "dist", "warren-exec"));
        await chmod(join(root, "opt", "warren", "envd", "dist", "warren-exec"), 0o755);
      }
      const packages = [
        ...ADDONS,
        ...(codeGateway ? await packageClosure(options.envdRoot, join(gatewayDir, "package.json")) : []),
      ];
      for (const name of packages) {
        const source = join(options.envdRoot, "node_modules", name);
        if (!existsSync(source)) continue;
        const target = join(root, "opt", "warren", "node_modules", name);
        await mkdir(join(target, ".."), { recursive: true });
        await exec("cp", ["-a", "-L", source, target]);
      }
      if (codeGateway) {
        // The gateway's imports resolve from /opt/warren/node_modules above, as in the namespace driver.
        const target = join(root, "opt", "warren", "code-gateway");
        await rm(target, { recursive: true, force: true });
        await mkdir(target, { recursive: true });
        for (const name of CODE_GATEWAY_FILES)
          await exec("cp", ["-a", "-L", join(gatewayDir, name), join(target, name)]);
      }
      await copyFile(options.busybox, join(root, "opt", "warren", "busybox"));
      await chmod(join(root, "opt", "warren", "busybox"), 0o755);
      await writeFile(join(root, "opt", "warren", "init"), guestInit(codeGateway), { mode: 0o755 });
      const used = await exec("du", ["-sm", root]);
      const sizeMiB = Number(used.stdout.split(/\s/)[0]) + diskSizeMB;
      await exec("mkfs.ext4", ["-q", "-F", "-L", "root", "-d", root, join(tmp, "rootfs.ext4"), `${sizeMiB}M`]);
      await rm(root, { recursive: true, force: true });
      await writeFile(join(tmp, "READY"), new Date().toISOString());
      await rm(dir, { recursive: true, force: true });
      await mkdir(join(options.dir, "images"), { recursive: true });
      await rename(tmp, dir);
      return ready();
    } catch (error) {
      await rm(tmp, { recursive: true, force: true });
      throw error;
    }
  });
}

/**
 * Undoes the templates' uid shift (../../templates/uid-shift.ts): a VM has its own kernel, so its files carry the
 * guest's real ids. chown clears setuid/setgid bits, so they are put back (sudo must stay setuid).
 */
async function unshiftOwners(root: string, base: number): Promise<void> {
  const visit = async (path: string): Promise<void> => {
    const st = await lstat(path);
    const inRange = (id: number) => id >= base && id < base + 65536;
    if (inRange(st.uid) || inRange(st.gid)) {
      await lchown(path, inRange(st.uid) ? st.uid - base : st.uid, inRange(st.gid) ? st.gid - base : st.gid);
      if (!st.isSymbolicLink() && st.mode & 0o6000) await chmod(path, st.mode & 0o7777);
    }
    if (st.isDirectory()) {
      const entries = await readdir(path);
      for (let i = 0; i < entries.length; i += 32) {
        await Promise.all(entries.slice(i, i + 32).map((name) => visit(join(path, name))));
      }
    }
  };
  await visit(root);
}

/** The packages a package.json depends on, with theirs, as hoisted in `<root>/node_modules` (nested ones come along). */
async function packageClosure(root: string, packageJson: string): Promise<string[]> {
  const depsOf = async (file: string): Promise<string[]> => {
    const manifest = JSON.parse(await readFile(file, "utf8")) as Record<string, Record<string, string> | undefined>;
    return Object.keys({ ...manifest.dependencies, ...manifest.optionalDependencies });
  };
  const seen = new Set<string>();
  const queue = await depsOf(packageJson);
  for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
    const manifest = join(root, "node_modules", name, "package.json");
    if (seen.has(name) || !existsSync(manifest)) continue;
    seen.add(name);
    queue.push(...(await depsOf(manifest)));
  }
  return [...seen].sort();
}

/** A content hash of files and directory trees (paths and bytes), so a changed code gateway makes a new image. */
async function treeDigest(paths: readonly string[]): Promise<string> {
  const hash = createHash("sha256");
  const visit = async (path: string): Promise<void> => {
    const st = await stat(path).catch(() => undefined);
    if (!st) return;
    hash.update(`${path}\0`);
    if (st.isDirectory()) for (const name of (await readdir(path)).sort()) await visit(join(path, name));
    else hash.update(await readFile(path));
  };
  for (const path of paths) await visit(path);
  return hash.digest("hex").slice(0, 16);
}
