import { execFileSync, spawnSync } from "node:child_process";
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readlinkSync,
  readSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { spoolArchive } from "../src/template/archive.js";
import { contextEntries } from "../src/template/context-files.js";
import { makeContext } from "./template/fixtures.js";

// The upload archive of a COPY step, unpacked with the system's tar: the members are the entries filesHash
// covers, with their content, modes and link targets.

const ctx = makeContext();

function members(archive: string, gzip = true): string[] {
  return execFileSync("tar", [gzip ? "-tzf" : "-tf", archive], { encoding: "utf8" })
    .split("\n")
    .filter(Boolean);
}

function expectedMembers(src: string, dir = ctx): string[] {
  return contextEntries(src, dir, []).map((e) =>
    e.relativePath === "" ? "./" : e.isDirectory ? `${e.relativePath}/` : e.relativePath,
  );
}

function extract(archive: string, gzip = true): string {
  const out = mkdtempSync(join(tmpdir(), "warren-tpl-out-"));
  // Members below a symlinked directory (E2B's selection has them: glob lists a symlinked directory's children
  // one level deep) cannot be extracted through the link; GNU tar reports them and goes on.
  spawnSync("tar", [gzip ? "-xzpf" : "-xpf", archive, "-C", out], { stdio: "ignore" });
  return out;
}

/** Whether a context path lies below a symlink (then tar does not extract it through the link). */
function belowSymlink(relativePath: string, dir = ctx): boolean {
  const parts = relativePath.split("/");
  for (let i = 1; i < parts.length; i++) {
    if (lstatSync(join(dir, ...parts.slice(0, i))).isSymbolicLink()) return true;
  }
  return false;
}

describe("the upload archive", () => {
  for (const src of [
    ".",
    "app",
    "./app",
    "app/",
    "*.txt",
    "d/*.txt",
    "link-to-a",
    "toplinkdir",
    "broken",
    "emptydir",
  ]) {
    test(`copy('${src}'): members in filesHash order, each with its content, mode and link target`, async () => {
      const archive = await spoolArchive(src, ctx, [], { resolveSymlinks: false, gzip: true });
      try {
        expect(members(archive.path)).toEqual(expectedMembers(src));
        const out = extract(archive.path);
        for (const entry of contextEntries(src, ctx, [])) {
          if (belowSymlink(entry.relativePath)) continue;
          const there = join(out, entry.relativePath);
          const here = lstatSync(entry.fullpath);
          const got = lstatSync(there);
          expect(got.mode, entry.relativePath).toBe(here.mode);
          if (here.isSymbolicLink()) expect(readlinkSync(there)).toBe(readlinkSync(entry.fullpath));
          else if (here.isFile()) expect(readFileSync(there)).toEqual(readFileSync(entry.fullpath));
        }
      } finally {
        await archive.cleanup();
      }
    });
  }

  test("resolveSymlinks stores what links point to; a broken link stays a link", async () => {
    for (const src of ["link-to-a", "toplinkdir", "broken"]) {
      const archive = await spoolArchive(src, ctx, [], { resolveSymlinks: true, gzip: true });
      const out = extract(archive.path);
      await archive.cleanup();
      const st = lstatSync(join(out, src));
      if (src === "link-to-a") {
        expect(st.isFile()).toBe(true);
        expect(readFileSync(join(out, src), "utf8")).toBe("a\n");
      } else if (src === "toplinkdir") {
        expect(st.isDirectory()).toBe(true);
      } else {
        expect(st.isSymbolicLink()).toBe(true);
      }
    }
  });

  test("gzip: false sends a plain tar; the default is gzip (1f 8b)", async () => {
    const plain = await spoolArchive("app", ctx, [], { resolveSymlinks: false, gzip: false });
    const gz = await spoolArchive("app", ctx, [], { resolveSymlinks: false, gzip: true });
    const head = (path: string) => {
      const b = Buffer.alloc(2);
      readSync(openSync(path, "r"), b, 0, 2, 0);
      return b.toString("hex");
    };
    expect(head(gz.path)).toBe("1f8b");
    expect(head(plain.path)).not.toBe("1f8b");
    expect(members(plain.path, false)).toEqual(expectedMembers("app"));
    expect(plain.size).toBe(lstatSync(plain.path).size);
    await plain.cleanup();
    await gz.cleanup();
  });

  test("ignore patterns leave files out of the archive as out of the hash", async () => {
    const archive = await spoolArchive("app", ctx, ["**/node_modules/**", "app/.config"], {
      resolveSymlinks: false,
      gzip: true,
    });
    const names = members(archive.path);
    await archive.cleanup();
    expect(names).toContain("app/lib/");
    expect(names.some((n) => n.startsWith("app/node_modules"))).toBe(false);
    expect(names).not.toContain("app/.config");
  });

  test("long paths (ustar prefix and PAX) and long link targets survive", async () => {
    const dir = mkdtempSync(join(tmpdir(), "warren-tpl-long-"));
    const mid = `${"m".repeat(60)}/${"n".repeat(60)}`;
    const longest = `${"x".repeat(120)}/${"y".repeat(120)}/${"z".repeat(120)}`;
    mkdirSync(join(dir, "t", mid), { recursive: true });
    mkdirSync(join(dir, "t", longest), { recursive: true });
    writeFileSync(join(dir, "t", mid, "file-with-a-name.txt"), "prefix split\n");
    writeFileSync(join(dir, "t", longest, `${"f".repeat(110)}.txt`), "pax path\n");
    symlinkSync(`/target/${"q".repeat(150)}`, join(dir, "t", "far-link"));
    writeFileSync(join(dir, "t", "ünïcødé.txt"), "utf8\n");
    const archive = await spoolArchive("t", dir, [], { resolveSymlinks: false, gzip: true });
    const out = extract(archive.path);
    await archive.cleanup();
    expect(readFileSync(join(out, "t", mid, "file-with-a-name.txt"), "utf8")).toBe("prefix split\n");
    expect(readFileSync(join(out, "t", longest, `${"f".repeat(110)}.txt`), "utf8")).toBe("pax path\n");
    expect(readlinkSync(join(out, "t", "far-link"))).toBe(`/target/${"q".repeat(150)}`);
    expect(readFileSync(join(out, "t", "ünïcødé.txt"), "utf8")).toBe("utf8\n");
  });
});
