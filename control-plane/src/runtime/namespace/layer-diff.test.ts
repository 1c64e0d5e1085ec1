import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  appendFileSync,
  type BigIntStats,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureUpper } from "./layer-diff.js";

// Real overlayfs over a tmpfs (the tests run as root, like the node agent): a sandbox's live view is compared with
// the view of its captured layers stacked as read-only lower dirs, which is what a sandbox made from the snapshot
// sees.
let root = "";
const mounts: string[] = [];
const path = (...parts: string[]) => join(root, ...parts);

function mount(args: string[], point: string): void {
  mkdirSync(point, { recursive: true });
  execFileSync("mount", [...args, point]);
  mounts.push(point);
}

/** Mounts `layers` (topmost first) over the template, read-only, as a sandbox made from them would stack them. */
function stack(name: string, layers: string[]): string {
  const point = path(name);
  mount(["-t", "overlay", "-o", `ro,lowerdir=${[...layers, path("template")].join(":")}`, "warren-test"], point);
  return point;
}

/** A name that is not UTF-8, with a newline, a space, a dash and a backslash; spelt as latin1 (one char a byte). */
const WEIRD_NAME = "we\xffird\nname -x\\y";
const bytesOf = (dir: string, rel: string) => Buffer.concat([Buffer.from(`${dir}/`), Buffer.from(rel, "latin1")]);

/** Every entry under `dir` with what a sandbox would see of it, one line each, sorted by path. */
function listTree(dir: string): string[] {
  const xattrs = readXattrs(dir);
  const lines = new Map<string, string>();
  const linked = new Map<string, string[]>();
  const visit = (rel: string) => {
    const abs = rel === "" ? Buffer.from(dir) : bytesOf(dir, rel);
    const st = lstatSync(abs, { bigint: true });
    const type = typeOf(st);
    let detail = "";
    if (type === "f") detail = `${st.size} ${createHash("sha256").update(readFileSync(abs)).digest("hex")}`;
    if (type === "l") detail = `-> ${readlinkSync(abs, { encoding: "buffer" }).toString("latin1")}`;
    if (type === "c") detail = `rdev=${st.rdev}`;
    const mode = (st.mode & 0o7777n).toString(8);
    lines.set(rel, `${JSON.stringify(rel)} ${type} ${mode} ${st.uid}:${st.gid} mtime=${st.mtimeNs} ${detail}`);
    if (xattrs.has(rel)) lines.set(rel, `${lines.get(rel)} xattrs=${xattrs.get(rel)}`);
    if (type !== "d" && st.nlink > 1n) {
      const key = `${st.dev}:${st.ino}`;
      linked.set(key, [...(linked.get(key) ?? []), rel]);
    }
    if (type !== "d") return;
    for (const name of readdirSync(abs, { encoding: "buffer" }).map((n) => n.toString("latin1"))) {
      visit(rel === "" ? name : `${rel}/${name}`);
    }
  };
  visit("");
  for (const group of linked.values()) for (const rel of group) lines.set(rel, `${lines.get(rel)} links=${group}`);
  return [...lines.keys()].sort().map((rel) => lines.get(rel) ?? "");
}

function typeOf(st: BigIntStats): string {
  if (st.isFile()) return "f";
  if (st.isDirectory()) return "d";
  if (st.isSymbolicLink()) return "l";
  return st.isCharacterDevice() ? "c" : "other";
}

/** rel path → its xattrs (`getfattr -R` lists them all in one run; through overlayfs, none of its own). */
function readXattrs(dir: string): Map<string, string> {
  const out = spawnSync("getfattr", ["-R", "-P", "-h", "-d", "-m", "-", "-e", "hex", "--absolute-names", dir]);
  const found = new Map<string, string>();
  for (const block of out.stdout.toString("latin1").split("\n\n")) {
    const [head, ...values] = block.split("\n").filter(Boolean);
    if (!head?.startsWith("# file: ")) continue;
    const name = head
      .slice("# file: ".length)
      .replace(/\\(\\|[0-7]{3})/g, (_, e: string) => (e === "\\" ? "\\" : String.fromCharCode(Number.parseInt(e, 8))));
    const rel = name === dir ? "" : name.slice(dir.length + 1);
    found.set(rel, values.sort().join(","));
  }
  return found;
}

/** Every path under `dir` (latin1), parents first. */
function entryNames(dir: string, rel = ""): string[] {
  return readdirSync(rel === "" ? Buffer.from(dir) : bytesOf(dir, rel), { encoding: "buffer" }).flatMap((name) => {
    const child = rel === "" ? name.toString("latin1") : `${rel}/${name.toString("latin1")}`;
    return lstatSync(bytesOf(dir, child)).isDirectory() ? [child, ...entryNames(dir, child)] : [child];
  });
}

function isWhiteout(file: string): boolean {
  const st = lstatSync(file);
  return st.isCharacterDevice() && st.rdev === 0 && st.uid === 0 && st.gid === 0;
}

function opaque(dir: string): boolean {
  return spawnSync("getfattr", ["--only-values", "-n", "trusted.overlay.opaque", dir]).stdout.toString() === "y";
}

/** Waits out the ctime safety window: what changed before is then not copied again by the capture after next. */
const pastSafetyWindow = () => sleep(300);

const live = () => path("live");
const upper = () => path("upper");

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "warren-layer-diff-"));
  mount(["-t", "tmpfs", "-o", "mode=0755", "warren-test"], root);
  const files: Record<string, string> = {
    "etc/hostname": "template\n",
    "etc/passwd": "root:x:0:0::/root:/bin/sh\n",
    "etc/motd": "hello\n",
    "etc/apt/sources.list": "deb template\n",
    "etc/apt/keep.conf": "keep\n",
    "usr/share/doc/readme": "doc\n",
    "srv/data/old1": "old\n",
    "opt/tdir/x": "x\n",
    "opt/tdir/y": "y\n",
  };
  for (const [rel, content] of Object.entries(files)) {
    mkdirSync(join(path("template"), rel, ".."), { recursive: true });
    writeFileSync(join(path("template"), rel), content);
  }
  for (const dir of ["upper", "work"]) mkdirSync(path(dir));
  mount(
    ["-t", "overlay", "-o", `lowerdir=${path("template")},upperdir=${upper()},workdir=${path("work")}`, "warren-test"],
    live(),
  );
});

afterAll(() => {
  for (const point of mounts.reverse()) spawnSync("umount", ["-l", point]);
  if (root) rmSync(root, { recursive: true, force: true });
});

describe("captureUpper", () => {
  it("a first capture copies the whole upper dir: files, links, owners, xattrs, whiteouts, opaque dirs", async () => {
    const home = join(live(), "home/user");
    mkdirSync(home, { recursive: true });
    writeFileSync(join(home, "big.bin"), Buffer.alloc(1 << 20, 7));
    for (const name of ["notes.txt", "old.txt", "moveme.txt", "perm.txt", "linked.txt", "pair-a", "tagged"]) {
      writeFileSync(join(home, name), `${name} v1\n`);
    }
    linkSync(join(home, "linked.txt"), join(home, "linked-2.txt"));
    linkSync(join(home, "pair-a"), join(home, "pair-b"));
    symlinkSync("notes.txt", join(home, "link"));
    execFileSync("setfattr", ["-n", "user.color", "-v", "blue", join(home, "tagged")]);
    writeFileSync(bytesOf(home, WEIRD_NAME), "weird\n");
    execFileSync("truncate", ["-s", "3M", join(home, "sparse")]);
    appendFileSync(join(home, "sparse"), "end");
    for (const dir of ["app/cache", "app/logs/sub", "app/conf"]) mkdirSync(join(live(), dir), { recursive: true });
    for (const file of ["app/cache/1", "app/cache/2", "app/logs/a.log", "app/logs/sub/c.log", "app/conf/x"]) {
      writeFileSync(join(live(), file), file);
    }
    rmSync(join(live(), "etc/motd"));
    appendFileSync(join(live(), "etc/apt/sources.list"), "deb more\n");
    rmSync(join(live(), "srv/data"), { recursive: true });
    mkdirSync(join(live(), "srv/data"));
    writeFileSync(join(live(), "srv/data/k1"), "k1\n");
    await pastSafetyWindow();

    const capture = await captureUpper({
      upperDir: upper(),
      layerDir: path("L1"),
      manifestFile: path("m1"),
    });
    expect(capture.kind).toBe("full");
    expect(capture.bytes).toBeGreaterThan((1 << 20) + (3 << 20));
    expect(isWhiteout(path("L1/etc/motd"))).toBe(true);
    expect(opaque(path("L1/srv/data"))).toBe(true);
    expect(listTree(stack("view-1", [path("L1")]))).toEqual(listTree(live()));
  });

  it("a second capture writes only what changed, and stacked on the first it shows the live view", async () => {
    const home = join(live(), "home/user");
    writeFileSync(join(home, "notes.txt"), "notes v2\n");
    rmSync(join(home, "old.txt"));
    rmSync(join(live(), "app/logs"), { recursive: true });
    rmSync(join(live(), "app/conf"), { recursive: true });
    writeFileSync(join(live(), "app/conf"), "a file now\n");
    writeFileSync(join(home, "new1.txt"), "new\n");
    mkdirSync(join(home, "newdir"));
    writeFileSync(join(home, "newdir/deep.txt"), "deep\n");
    execFileSync("chmod", ["0640", join(home, "perm.txt")]);
    execFileSync("chown", ["1234:5678", join(home, "perm.txt")]);
    renameSync(join(home, "moveme.txt"), join(home, "moved.txt"));
    appendFileSync(join(home, "linked.txt"), "v2\n");
    symlinkSync("/etc/hostname", join(home, "link2"));
    execFileSync("setfattr", ["-n", "user.color", "-v", "red", join(home, "new1.txt")]);
    rmSync(join(live(), "etc/passwd"));
    // A template dir copied up before the first capture, then replaced: opaque now.
    rmSync(join(live(), "etc/apt"), { recursive: true });
    mkdirSync(join(live(), "etc/apt"));
    writeFileSync(join(live(), "etc/apt/new.list"), "deb new\n");
    // A dir of the upper dir only, replaced: not opaque, its old children must be hidden one by one.
    rmSync(join(live(), "app/cache"), { recursive: true });
    mkdirSync(join(live(), "app/cache"));
    writeFileSync(join(live(), "app/cache/3"), "3\n");
    // A new child in a dir that was already opaque at the first capture.
    writeFileSync(join(live(), "srv/data/k2"), "k2\n");
    // A template dir replaced only now.
    rmSync(join(live(), "opt/tdir"), { recursive: true });
    mkdirSync(join(live(), "opt/tdir"));
    writeFileSync(join(live(), "opt/tdir/z"), "z\n");
    await pastSafetyWindow();

    const capture = await captureUpper({
      upperDir: upper(),
      layerDir: path("L2"),
      manifestFile: path("m2"),
      previousManifestFile: path("m1"),
    });
    expect(capture.kind).toBe("diff");
    expect(capture.bytes).toBeLessThan(1024);
    const names = entryNames(path("L2"));
    for (const unchanged of ["big.bin", "sparse", "pair-a", "pair-b", "tagged", "link", WEIRD_NAME]) {
      expect(names).not.toContain(`home/user/${unchanged}`);
    }
    expect(names).not.toContain("srv/data/k1");
    expect(Number(execFileSync("du", ["-sb", path("L2")], { encoding: "utf8" }).split("\t")[0])).toBeLessThan(64 << 10);
    for (const gone of ["home/user/old.txt", "home/user/moveme.txt", "app/logs"]) {
      expect(isWhiteout(path("L2", gone)), gone).toBe(true);
    }
    // Only the topmost removed path, and none inside a dir that replaced another one (it is opaque instead).
    for (const hidden of ["app/logs/a.log", "app/cache/1", "etc/apt/sources.list"]) expect(names).not.toContain(hidden);
    expect(opaque(path("L2/app/cache"))).toBe(true);
    expect(isWhiteout(path("L2/etc/passwd"))).toBe(true);
    expect(lstatSync(path("L2/home/user/linked.txt")).ino).toBe(lstatSync(path("L2/home/user/linked-2.txt")).ino);
    expect(opaque(path("L2/srv/data"))).toBe(false);
    expect(opaque(path("L2/etc/apt"))).toBe(true);
    expect(capture.entries).toBe(names.length);

    expect(listTree(stack("view-2", [path("L2"), path("L1")]))).toEqual(listTree(live()));
  });

  it("a capture with nothing changed is empty; a change right after a capture is never missed", async () => {
    const idle = await captureUpper({
      upperDir: upper(),
      layerDir: path("L3"),
      manifestFile: path("m3"),
      previousManifestFile: path("m2"),
    });
    expect(idle).toEqual({ kind: "diff", entries: 0, bytes: 0 });
    expect(readdirSync(path("L3"))).toEqual([]);

    writeFileSync(join(live(), "home/user/late.txt"), "late\n");
    await captureUpper({
      upperDir: upper(),
      layerDir: path("L4"),
      manifestFile: path("m4"),
      previousManifestFile: path("m3"),
    });
    // Changed again at once, same size, likely within the same tick of the kernel's coarse clock (so possibly the
    // same ctime): the previous capture saw it changed in its own tick, so this one copies it again whatever.
    writeFileSync(join(live(), "home/user/late.txt"), "LATE\n");
    const again = await captureUpper({
      upperDir: upper(),
      layerDir: path("L5"),
      manifestFile: path("m5"),
      previousManifestFile: path("m4"),
    });
    expect(again.kind).toBe("diff");
    expect(entryNames(path("L5"))).toContain("home/user/late.txt");
    expect(readFileSync(join(path("L5"), "home/user/late.txt"), "utf8")).toBe("LATE\n");
    expect(entryNames(path("L5"))).not.toContain("home/user/big.bin");
    const layers = ["L5", "L4", "L3", "L2", "L1"].map((name) => path(name));
    expect(listTree(stack("view-5", layers))).toEqual(listTree(live()));
  });

  it("falls back to a full copy when the previous manifest is corrupt, missing or of another upper dir", async () => {
    writeFileSync(path("corrupt"), "not a manifest");
    const previous = [path("corrupt"), path("no-such-manifest")];
    for (const [i, previousManifestFile] of previous.entries()) {
      const capture = await captureUpper({
        upperDir: upper(),
        layerDir: path(`full-${i}`),
        manifestFile: path(`mf-${i}`),
        previousManifestFile,
      });
      expect(capture.kind).toBe("full");
      expect(listTree(stack(`view-full-${i}`, [path(`full-${i}`)]))).toEqual(listTree(live()));
    }
    mkdirSync(path("other-upper"));
    const other = await captureUpper({
      upperDir: path("other-upper"),
      layerDir: path("other-layer"),
      manifestFile: path("other-m"),
      previousManifestFile: path("m5"),
    });
    expect(other).toEqual({ kind: "full", entries: 0, bytes: 0 });
  });

  it("a failed capture leaves neither layer nor manifest", async () => {
    await expect(
      captureUpper({ upperDir: path("missing"), layerDir: path("L-failed"), manifestFile: path("m-failed") }),
    ).rejects.toThrow(/capturing upper dir '.*\/missing'/);
    expect(existsSync(path("L-failed"))).toBe(false);
    expect(readdirSync(root).filter((name) => name.startsWith("m-failed"))).toEqual([]);
  });
});
