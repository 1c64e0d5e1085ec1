import { readFile } from "node:fs/promises";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CgroupManager, detectCgroupManager, favorDynamicModifications } from "./cgroups.js";

// Real cgroup v1 hierarchies (this host; the tests run as root), as the namespace driver makes them.
const PARENT = "warren/test-background";
const CPU = "/sys/fs/cgroup/cpu/warren/test-background";
const RESOURCES = { cpuCount: 2, memoryMB: 128, diskSizeMB: 64, pidsMax: 16 };

const cpuFile = (name: string, file: string) => readFile(`${CPU}/${name}/${file}`, "utf8").then((text) => text.trim());

describe("the background CPU class (cgroup v1)", () => {
  let cgroups: CgroupManager;

  beforeAll(async () => {
    cgroups = detectCgroupManager(PARENT);
    await cgroups.prepare();
    for (const name of ["bgone", "fgone"]) await cgroups.open(name).remove();
  });

  afterAll(async () => {
    for (const name of ["bgone", "fgone"]) await cgroups.open(name).remove();
  });

  it("a background sandbox's own cpu cgroup has the minimum weight and half a CPU until foreground() gives it its own", async () => {
    const cgroup = await cgroups.create("bgone", RESOURCES, { background: true });
    expect(await cpuFile("bgone", "cpu.shares")).toBe("2");
    expect(await cpuFile("bgone", "cpu.cfs_quota_us")).toBe("50000");
    // Its processes join the same cgroups as any sandbox's (none moves later: CRIU needs them where they began).
    expect(cgroup.procsFiles).toContain(`${CPU}/bgone/cgroup.procs`);

    await cgroup.foreground(RESOURCES.cpuCount);
    expect(await cpuFile("bgone", "cpu.shares")).toBe("1024");
    expect(await cpuFile("bgone", "cpu.cfs_quota_us")).toBe("200000");
    await cgroup.foreground(RESOURCES.cpuCount);
    expect(await cpuFile("bgone", "cpu.shares")).toBe("1024");
    await cgroup.remove();
    expect(cgroup.exists()).toBe(false);
  });

  it("a sandbox made in the foreground has the normal weight and its quota from the start", async () => {
    const cgroup = await cgroups.create("fgone", { ...RESOURCES, cpuCount: 0.25 });
    expect(await cpuFile("fgone", "cpu.shares")).toBe("1024");
    expect(await cpuFile("fgone", "cpu.cfs_quota_us")).toBe("25000");
    await cgroup.remove();
  });
});

describe("favorDynamicModifications", () => {
  it("leaves a cgroup hierarchy with the kernel's favordynmods mounted, once", async () => {
    const favoring = async () =>
      (await readFile("/proc/mounts", "utf8"))
        .split("\n")
        .filter((line) => /\bcgroup2? \S*\bfavordynmods\b/.test(line));
    expect(await favorDynamicModifications()).toBeUndefined();
    const mounted = await favoring();
    expect(mounted.length).toBeGreaterThan(0);
    expect(await favorDynamicModifications()).toBeUndefined();
    expect(await favoring()).toEqual(mounted);
  });
});
