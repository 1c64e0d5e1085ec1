import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "@warren/platform/log";
import { afterEach, describe, expect, it } from "vitest";
import type { SharedTemplates } from "./sharing.js";
import { SHIPPED_BUILD_SPECS } from "./shipped-specs.js";
import { TemplateStore, TemplateUnavailableError } from "./store.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function cache(): string {
  const dir = mkdtempSync(join(tmpdir(), "warren-store-"));
  dirs.push(dir);
  return dir;
}

const noCheck = async () => undefined;

describe("the shipped templates' cache (one path: the template builder)", () => {
  it("a template's hash and store name do not depend on whether this node can ask the builder", () => {
    const dir = cache();
    const asking = new TemplateStore({ dir, uidBase: 100_000, log: silentLogger, fromBuilder: async () => ({}) });
    const copying = new TemplateStore({ dir, uidBase: 100_000, log: silentLogger });
    for (const id of ["base", "code-interpreter-v1", "scratch", "base-vm"]) {
      expect(asking.hash(id)).toBe(copying.hash(id));
      expect(asking.sharedName(id)).toBe(copying.sharedName(id));
    }
    // A changed spec is another template.
    const changed = new TemplateStore({
      dir,
      uidBase: 100_000,
      log: silentLogger,
      specs: { ...SHIPPED_BUILD_SPECS, base: { ...SHIPPED_BUILD_SPECS.base, steps: [] } },
    });
    expect(changed.hash("base")).not.toBe(copying.hash("base"));
  });

  it("without the builder and without a store's copy, `base` fails at once, naming why, and leaves nothing", async () => {
    const dir = cache();
    const store = new TemplateStore({ dir, uidBase: 100_000, log: silentLogger });
    const failure = store.ensure("base", noCheck);
    await expect(failure).rejects.toBeInstanceOf(TemplateUnavailableError);
    await expect(failure).rejects.toThrow(/made by the master's template builder/);
    expect(readdirSync(dir).filter((name) => name !== "locks")).toEqual([]);
  });

  it("the builder's hand-over becomes the template, its manifest naming the spec and the build", async () => {
    const dir = cache();
    const asked: string[] = [];
    const store = new TemplateStore({
      dir,
      uidBase: 100_000,
      log: silentLogger,
      fromBuilder: async (id, rootfs) => {
        asked.push(id);
        mkdirSync(join(rootfs, "etc"), { recursive: true });
        writeFileSync(join(rootfs, "etc", "made-by"), "builder");
        return { buildId: "b-1", snapshotId: "s-1" };
      },
    });
    let checked = 0;
    const base = await store.ensure("base", async () => {
      checked++;
    });
    expect(asked).toEqual(["base"]);
    expect(checked).toBe(1);
    expect(existsSync(join(base.rootfs, "etc", "made-by"))).toBe(true);
    expect(await store.manifest("base")).toMatchObject({
      id: "base",
      builder: { spec: SHIPPED_BUILD_SPECS.base, buildId: "b-1", snapshotId: "s-1" },
    });
    // A copy of it needs no builder: `base-vm` is `base`'s rootfs copied.
    const vm = await store.ensure("base-vm", noCheck);
    expect(asked).toEqual(["base"]);
    expect(existsSync(join(vm.rootfs, "etc", "made-by"))).toBe(true);
    expect(await store.manifest("base-vm")).toMatchObject({ id: "base-vm", parentCopiedCtimeNs: expect.any(String) });
  });

  it("a failed hand-over leaves no template folder, and the next ask runs again", async () => {
    const dir = cache();
    let tries = 0;
    const store = new TemplateStore({
      dir,
      uidBase: 100_000,
      log: silentLogger,
      fromBuilder: async (_id, rootfs) => {
        tries++;
        mkdirSync(rootfs);
        if (tries === 1) throw new Error("the build failed at step 2");
        return {};
      },
    });
    await expect(store.ensure("base", noCheck)).rejects.toThrow(/step 2/);
    expect(readdirSync(dir).filter((name) => name !== "locks")).toEqual([]);
    await store.ensure("base", noCheck);
    expect(tries).toBe(2);
    expect(store.ready("base")).toBeDefined();
  });

  it("a node that cannot ask the builder never claims a build: it waits for the store's copy and pulls it", async () => {
    const dir = cache();
    let looks = 0;
    const shared: SharedTemplates = {
      description: "a test store",
      has: async () => looks > 2,
      digest: async () => undefined,
      fetch: async (_name, rootfs) => {
        looks++;
        if (looks <= 2) return undefined;
        mkdirSync(join(rootfs, "etc"), { recursive: true });
        writeFileSync(join(rootfs, "etc", "made-by"), "another node");
        return { digest: `sha256:${"0".repeat(64)}`, bytes: 1, uidBase: 100_000 };
      },
      claim: async () => {
        throw new Error("a node that cannot ask the builder claimed its build");
      },
      collect: async () => [],
    };
    const store = new TemplateStore({ dir, uidBase: 100_000, log: silentLogger, shared, sharedPollMs: 10 });
    const base = await store.ensure("base", noCheck);
    expect(looks).toBe(3);
    expect(existsSync(join(base.rootfs, "etc", "made-by"))).toBe(true);
    expect(await store.manifest("base")).toMatchObject({ pulledFrom: { store: "a test store" } });
  });
});
