import { realpathSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { readElf } from "./elf.js";

const LIBC = realpathSync("/lib/x86_64-linux-gnu/libc.so.6");

describe.skipIf(process.arch !== "x64")("ELF facts the loader uses", () => {
  it("the host's node: glibc loader, the libraries it links and the glibc versions it needs", async () => {
    const node = await readElf(process.execPath);
    expect(node?.machine).toBe(62);
    expect(node?.interpreter).toBe("/lib64/ld-linux-x86-64.so.2");
    expect(node?.needed).toEqual(expect.arrayContaining(["libc.so.6", "libstdc++.so.6", "libm.so.6"]));
    expect(node?.versionsNeeded.get("libc.so.6")).toEqual(expect.arrayContaining(["GLIBC_2.2.5"]));
    expect(node?.versionsNeeded.get("libstdc++.so.6")?.some((v) => v.startsWith("GLIBCXX_3.4"))).toBe(true);
  });

  it("libc defines the versions node needs, and names itself", async () => {
    const libc = await readElf(LIBC);
    const node = await readElf(process.execPath);
    expect(libc?.soname).toBe("libc.so.6");
    for (const version of node?.versionsNeeded.get("libc.so.6") ?? []) {
      expect(libc?.versionsDefined).toContain(version);
    }
  });

  it("a static binary has no interpreter and needs nothing; a non-ELF file is undefined", async () => {
    const tini = await readElf("/usr/bin/tini-static");
    expect(tini?.interpreter).toBeUndefined();
    expect(tini?.needed).toEqual([]);
    expect(await readElf("/etc/passwd")).toBeUndefined();
    expect(await readElf("/etc")).toBeUndefined();
  });
});
