import { execFileSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { readElf } from "./elf.js";
import { prepareRootfs, shiftImageOwners } from "./prepare.js";

const BASE = 100000;
const REPO_ROOT = fileURLToPath(new URL("../../../..", import.meta.url));
const LIB = "/lib/x86_64-linux-gnu";
const roots: string[] = [];

afterEach(() => {
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

function scratch(): string {
  const dir = mkdtempSync(join(tmpdir(), "warren-oci-prepare-"));
  roots.push(dir);
  return dir;
}

/** A rootfs with busybox as its only program (like the `busybox` image): no libc at all. */
function busyboxRoot(): string {
  const root = join(scratch(), "rootfs");
  mkdirSync(join(root, "bin"), { recursive: true });
  copyFileSync("/usr/bin/busybox", join(root, "bin/busybox"));
  chmodSync(join(root, "bin/busybox"), 0o755);
  symlinkSync("busybox", join(root, "bin/sh"));
  return root;
}

function put(root: string, path: string, content: string, mode = 0o644): void {
  mkdirSync(dirname(join(root, path)), { recursive: true });
  writeFileSync(join(root, path), content, { mode });
}

function copyHostLib(root: string, dir: string, soname: string, as = soname): void {
  mkdirSync(join(root, dir), { recursive: true });
  copyFileSync(realpathSync(`${LIB}/${soname}`), join(root, dir, as));
}

const prepare = (root: string) =>
  prepareRootfs(root, { imageName: "test/img", uidBase: BASE, nodeBinary: process.execPath, envdRoot: REPO_ROOT });

async function imageError(promise: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await promise;
  } catch (error) {
    return error as { code: string; message: string };
  }
  throw new Error("expected an ImageError");
}

describe.skipIf(process.arch !== "x64")("preparing an unpacked image for the namespace driver", () => {
  it("an image without glibc gets the host's loader and node's libraries in /lib/x86_64-linux-gnu, where only glibc looks", async () => {
    const root = busyboxRoot();
    put(root, "/lib/ld-musl-x86_64.so.1", "musl");
    // A busybox setpriv applet has no --reuid: it is replaced by the host's util-linux one.
    mkdirSync(join(root, "usr/bin"), { recursive: true });
    symlinkSync("/bin/busybox", join(root, "usr/bin/setpriv"));
    const prepared = await prepare(root);
    expect(prepared.libc).toBe("host");
    expect(prepared.added).toEqual(
      expect.arrayContaining([
        "/lib64/ld-linux-x86-64.so.2",
        `${LIB}/libc.so.6`,
        `${LIB}/libstdc++.so.6`,
        "/usr/bin/tini",
        "/usr/bin/setpriv",
        `${LIB}/libcap-ng.so.0`,
        // node-pty, envd's native module for ptys, links libutil.
        `${LIB}/libutil.so.1`,
        "/bin/bash",
      ]),
    );
    expect(readFileSync(join(root, "lib/ld-musl-x86_64.so.1"), "utf8")).toBe("musl");
    expect((await readElf(join(root, "usr/bin/tini")))?.interpreter).toBeUndefined();
    expect((await readElf(join(root, "usr/bin/setpriv")))?.needed).toContain("libcap-ng.so.0");
    // The copied loader resolves every library node and bash need inside the rootfs (it runs only host code).
    for (const program of ["/bin/bash", "/usr/bin/setpriv"]) {
      const list = execFileSync("chroot", [root, "/lib64/ld-linux-x86-64.so.2", "--list", program], {
        encoding: "utf8",
      });
      expect(list).not.toContain("not found");
      expect(list).toContain(`${LIB}/libc.so.6`);
    }
    expect(prepared.missingTools).toEqual(["sudo", "curl", "ss", "pgrep", "inotifywait", "git", "python3"]);
  });

  it("a glibc image (merged /usr) keeps its own libc; what it lacks (libstdc++) is copied next to it", async () => {
    const root = join(scratch(), "rootfs");
    const usrLib = "/usr/lib/x86_64-linux-gnu";
    for (const lib of ["libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "libgcc_s.so.1", "libtinfo.so.6"]) {
      copyHostLib(root, usrLib, lib);
    }
    copyHostLib(root, usrLib, "ld-linux-x86-64.so.2");
    mkdirSync(join(root, "usr/lib64"), { recursive: true });
    symlinkSync(`${usrLib}/ld-linux-x86-64.so.2`, join(root, "usr/lib64/ld-linux-x86-64.so.2"));
    for (const dir of ["lib", "lib64", "bin"]) symlinkSync(`usr/${dir}`, join(root, dir));
    mkdirSync(join(root, "usr/bin"), { recursive: true });
    copyFileSync("/bin/bash", join(root, "usr/bin/bash"));
    chmodSync(join(root, "usr/bin/bash"), 0o755);
    const prepared = await prepare(root);
    expect(prepared.libc).toBe("image");
    // Found through the /lib → usr/lib symlink, so that is the directory it names.
    expect(prepared.added).toContain(`${LIB}/libstdc++.so.6`);
    expect(prepared.added).toContain("/usr/bin/setpriv");
    expect(prepared.added).not.toContain("/bin/bash");
    expect(prepared.added.some((p) => p.includes("libc.so.6") || p.includes("ld-linux"))).toBe(false);
    expect(existsSync(join(root, "usr/lib/x86_64-linux-gnu/libstdc++.so.6"))).toBe(true);
    expect(lstatSync(join(root, "lib")).isSymbolicLink()).toBe(true);
  });

  it("an image whose libc lacks symbol versions node needs is refused as too old, naming them", async () => {
    const root = join(scratch(), "rootfs");
    copyHostLib(root, LIB, "ld-linux-x86-64.so.2");
    mkdirSync(join(root, "lib64"));
    symlinkSync(`${LIB}/ld-linux-x86-64.so.2`, join(root, "lib64/ld-linux-x86-64.so.2"));
    for (const lib of ["libm.so.6", "libdl.so.2", "libpthread.so.0", "libgcc_s.so.1", "libstdc++.so.6"]) {
      copyHostLib(root, LIB, lib);
    }
    // libm defines GLIBC_2.x versions too, but not libc's: it stands in for a libc older than node's.
    copyHostLib(root, LIB, "libm.so.6", "libc.so.6");
    const error = await imageError(prepare(root));
    expect(error.code).toBe("unsupported");
    expect(error.message).toMatch(
      /^image 'test\/img' is too old for envd: its \/lib\/x86_64-linux-gnu\/libc.so.6 lacks GLIBC_2\.[\d.]+(, GLIBC_[\w.]+)*, which the host's node \(envd's runtime\) needs$/,
    );
  });

  it("half a glibc (Alpine's gcompat: a loader but no libc.so.6) is refused", async () => {
    const root = busyboxRoot();
    put(root, "/lib/ld-musl-x86_64.so.1", "musl");
    mkdirSync(join(root, "lib64"));
    symlinkSync("/lib/ld-musl-x86_64.so.1", join(root, "lib64/ld-linux-x86-64.so.2"));
    const error = await imageError(prepare(root));
    expect(error).toMatchObject({ code: "unsupported" });
    expect(error.message).toContain("has a program loader at /lib64/ld-linux-x86-64.so.2 but no GNU libc");
  });

  it("symlinks in the image never lead a write out of the rootfs", async () => {
    const outside = scratch();
    writeFileSync(join(outside, "hosts"), "host's own");
    const root = busyboxRoot();
    symlinkSync(outside, join(root, "etc"));
    symlinkSync(`../../../../../../../..${outside}`, join(root, "opt"));
    mkdirSync(join(root, "home"));
    symlinkSync("/", join(root, "home/user"));
    await prepare(root);
    expect(readdirSync(outside)).toEqual(["hosts"]);
    expect(readFileSync(join(outside, "hosts"), "utf8")).toBe("host's own");
    // The writes went where the sandbox will look: the symlinks' targets inside the rootfs.
    expect(readFileSync(join(root, outside, "hostname"), "utf8")).toBe("sandbox\n");
    expect(readFileSync(join(root, outside, "passwd"), "utf8")).toContain("user:x:1000:1000::/home/user:/bin/bash");
    expect(statSync(join(root, outside, "warren/envd")).isDirectory()).toBe(true);
  });

  it("user takes the next free uid when 1000 is taken; shadow files get entries; sudo gets a drop-in", async () => {
    const root = busyboxRoot();
    put(root, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh");
    put(root, "/etc/group", "root:x:0:\nubuntu:x:1000:\n");
    put(root, "/etc/shadow", "root:*:19000:0:99999:7:::\n", 0o640);
    put(root, "/etc/gshadow", "root:*::\n", 0o640);
    put(root, "/etc/sudoers", "root ALL=(ALL:ALL) ALL\n", 0o440);
    put(root, "/etc/skel/.bashrc", "# skel\n");
    put(root, "/usr/bin/sudo", "", 0o4755);
    symlinkSync("/etc/hosts", join(root, "etc/resolv.conf"));
    const prepared = await prepare(root);
    expect(prepared.user).toEqual({
      uid: 1001,
      gid: 1001,
      home: "/home/user",
      shell: "/bin/bash",
      created: true,
      sudo: true,
    });
    expect(readFileSync(join(root, "etc/passwd"), "utf8")).toBe(
      "root:x:0:0:root:/root:/bin/sh\nubuntu:x:1000:1000::/home/ubuntu:/bin/sh\nuser:x:1001:1001::/home/user:/bin/bash\n",
    );
    expect(readFileSync(join(root, "etc/group"), "utf8")).toBe("root:x:0:\nubuntu:x:1000:\nuser:x:1001:\n");
    expect(readFileSync(join(root, "etc/shadow"), "utf8")).toMatch(/\nuser:!:\d+:0:99999:7:::\n$/);
    expect(readFileSync(join(root, "etc/gshadow"), "utf8")).toBe("root:*::\nuser:!::\n");
    expect(statSync(join(root, "etc/shadow")).mode & 0o777).toBe(0o640);
    expect(readFileSync(join(root, "etc/sudoers.d/user"), "utf8")).toBe("user ALL=(ALL:ALL) NOPASSWD: ALL\n");
    expect(statSync(join(root, "etc/sudoers.d/user")).mode & 0o777).toBe(0o440);
    expect(readFileSync(join(root, "etc/sudoers"), "utf8")).toContain("\n@includedir /etc/sudoers.d\n");
    expect(readFileSync(join(root, "home/user/.bashrc"), "utf8")).toBe("# skel\n");
    expect(statSync(join(root, "home/user/.bashrc")).uid).toBe(BASE + 1001);
    // Bind-mount targets are plain files: a symlink would redirect the driver's bind.
    expect(lstatSync(join(root, "etc/resolv.conf")).isFile()).toBe(true);
    expect(readFileSync(join(root, "etc/resolv.conf"), "utf8")).toBe("");
    expect(statSync(join(root, "usr/local/bin/node")).mode & 0o777).toBe(0o755);
    // envd's node goes to a path of Warren's own (an image's own /usr/local/bin/node stays the sandbox's).
    expect(lstatSync(join(root, "opt/warren/bin/node")).isFile()).toBe(true);
    expect(statSync(join(root, "usr/bin/sudo")).mode & 0o7777).toBe(0o4755);
  });

  it("an image's own `user` is kept as it is", async () => {
    const root = busyboxRoot();
    put(root, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:2000:2000::/srv/user:/bin/sh\n");
    put(root, "/etc/group", "root:x:0:\nuser:x:2000:\n");
    const prepared = await prepare(root);
    expect(prepared.user).toMatchObject({ uid: 2000, gid: 2000, home: "/srv/user", shell: "/bin/sh", created: false });
    expect(statSync(join(root, "srv/user")).uid).toBe(BASE + 2000);
  });

  it("owners move into the sandbox range; ids it cannot map become nobody; setuid stays; hardlinks count once; device nodes go", async () => {
    const root = join(scratch(), "rootfs");
    put(root, "/a", "12345");
    put(root, "/b", "x", 0o4755);
    put(root, "/c", "y");
    linkSync(join(root, "a"), join(root, "a2"));
    chownSync(join(root, "b"), 1000, 1000);
    chownSync(join(root, "c"), 70000, 70001);
    chmodSync(join(root, "b"), 0o4755);
    mkdirSync(join(root, "home/x"), { recursive: true });
    execFileSync("mknod", [join(root, "home/x/sda"), "b", "8", "0"]);
    execFileSync("mknod", [join(root, "null"), "c", "1", "3"]);
    execFileSync("mkfifo", [join(root, "fifo")]);
    const { bytes, devices } = await shiftImageOwners(root, BASE);
    expect(bytes).toBe(5 + 1 + 1);
    expect(devices.sort()).toEqual(["/home/x/sda", "/null"]);
    expect(existsSync(join(root, "home/x/sda"))).toBe(false);
    expect(lstatSync(join(root, "fifo")).isFIFO()).toBe(true);
    expect(statSync(root).uid).toBe(BASE);
    expect(statSync(join(root, "a2")).uid).toBe(BASE);
    expect(statSync(join(root, "b"))).toMatchObject({ uid: BASE + 1000, gid: BASE + 1000 });
    expect(statSync(join(root, "b")).mode & 0o7777).toBe(0o4755);
    expect(statSync(join(root, "c"))).toMatchObject({ uid: BASE + 65534, gid: BASE + 65534 });
  });
});
