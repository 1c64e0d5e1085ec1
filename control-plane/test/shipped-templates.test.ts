import { randomBytes } from "node:crypto";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { templateBuildClaimKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger, type Logger } from "../src/node-agent/log.js";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { StoreSharedTemplates } from "../src/node-agent/shipped-templates.js";
import { SnapshotStore } from "../src/node-agent/snapshot-store.js";
import type { TemplateImage } from "../src/runtime/driver.js";
import { TEMPLATE_RECIPES, type TemplateRecipe } from "../src/templates/catalog.js";
import { SHIPPED_BUILD_SPECS, type ShippedBuildSpec } from "../src/templates/shipped-specs.js";
import { TemplateStore } from "../src/templates/store.js";
import { startLoopbackRegistry } from "./loopback-registry.js";
import { BUILD_TIMEOUT_MS, purgeAgent, sdkSandbox, startTestAgent, testConfig, until } from "./node-agent-harness.js";

// Shipped templates shared through the cluster's store (templates/sharing.ts, node-agent/shipped-templates.ts): the
// node that has `base` publishes it, a node with an empty template cache and another uid base pulls it (no build)
// and starts sandboxes from it; two nodes asking for a new template at once have it built once; a copy whose bytes
// do not match its digest is refused; a dead builder's claim expires and another node builds.

const tmp = mkdtempSync(join("/var/lib/warren", "test-shipped-"));
const storeUrl = `oci:${join(tmp, "store")}`;
const prefix = `sts${randomBytes(3).toString("hex")}:`;
const A = { instance: "sha", cidr: "10.251.0.0/24" };
const B = { instance: "shb", cidr: "10.251.1.0/24" };
const UID_BASE_B = 300_000;

const sharedEnv = {
  WARREN_STORE: storeUrl,
  WARREN_SHARE_SHIPPED_TEMPLATES: "on",
  WARREN_REDIS_PREFIX: prefix,
};

/** A template the builder would make, with nothing of `base`'s: its flags only (its content is the stand-in's). */
function made(id: string): TemplateRecipe {
  return { id, defaults: TEMPLATE_RECIPES.base?.defaults as TemplateRecipe["defaults"], allowSetuid: true };
}

const RECIPES = {
  base: TEMPLATE_RECIPES.base as TemplateRecipe,
  tiny: made("tiny"),
  orphan: made("orphan"),
  // A copy of `base` (as `base-vm` is): published as its difference over the store's `base`.
  layered: { ...made("layered"), parent: "base" },
};

/** What the builder would be asked for; a spec is part of a template's identity (its name in the store). */
function specOf(note: string): ShippedBuildSpec {
  return { ...SHIPPED_BUILD_SPECS.base, steps: [{ type: "RUN", args: [`echo ${note}`, "root"], force: false }] };
}
const SPECS = { base: SHIPPED_BUILD_SPECS.base, tiny: specOf("tiny"), orphan: specOf("orphan") };

/**
 * Stands in for the master's template builder handing a template over (the node's `fromBuilder` seam; the real
 * one is e2e/test/shipped-from-builder.test.ts): a random stamp, so two builds never make the same bytes, and a
 * setuid file owned by `user` in the node's uid range, as a build's prepared rootfs is. These nodes never build
 * `base`: node A published it.
 */
function standInBuilder(uidBase: number) {
  return async (id: string, rootfs: string): Promise<Record<string, unknown>> => {
    if (id === "base") throw new Error("the test's nodes pull `base` from the store; they never build it");
    mkdirSync(join(rootfs, "opt"), { recursive: true });
    writeFileSync(join(rootfs, "stamp"), randomBytes(16).toString("hex"));
    copyFileSync("/bin/true", join(rootfs, "opt/suid-true"));
    chownSync(join(rootfs, "opt/suid-true"), uidBase + 1000, uidBase + 1000);
    chmodSync(join(rootfs, "opt/suid-true"), 0o4755);
    return { buildId: `stand-in-${id}` };
  };
}

const redis = new Redis({ keyPrefix: prefix, lazyConnect: true });
const opened: StoreSharedTemplates[] = [];

/** A node's template cache with the cluster's sharing, as the node agent wires it; `lines` gets its log. */
function node(
  name: string,
  uidBase: number,
  lines: string[],
  options: { cache?: string; url?: string; specs?: Record<string, ShippedBuildSpec>; graceMs?: number } = {},
): TemplateStore {
  const url = options.url ?? storeUrl;
  const shared = new StoreSharedTemplates({
    store: { url, insecure: url.startsWith("docker://") },
    workDir: join(tmp, `${name}-work`),
    redisUrl: "redis://127.0.0.1:6379",
    redisPrefix: prefix,
    nodeId: name,
  });
  opened.push(shared);
  const log: Logger = createLogger("node-agent", { level: "info", write: (line) => void lines.push(line) });
  return new TemplateStore({
    dir: join(tmp, `${options.cache ?? name}-templates`),
    uidBase,
    recipes: RECIPES,
    specs: options.specs ?? SPECS,
    fromBuilder: standInBuilder(uidBase),
    shared,
    sharedPollMs: 200,
    ...(options.graceMs !== undefined ? { sharedGraceMs: options.graceMs } : {}),
    log,
  });
}

const noCheck = async () => undefined;

/** The layer file of a tag in the layout store. */
function blobOf(tag: string): string {
  const store = join(tmp, "store");
  const index = JSON.parse(readFileSync(join(store, "index.json"), "utf8"));
  const entry = index.manifests.find(
    (m: { annotations: Record<string, string> }) => m.annotations["org.opencontainers.image.ref.name"] === tag,
  );
  const manifest = JSON.parse(readFileSync(join(store, "blobs", entry.digest.replace(":", "/")), "utf8"));
  return join(store, "blobs", manifest.layers[0].digest.replace(":", "/"));
}
const messages = (lines: readonly string[], templateId: string) =>
  lines
    .map((line) => JSON.parse(line) as { msg: string; templateId?: string })
    .filter((l) => l.templateId === templateId)
    .map((l) => l.msg);

let a: RunningNodeAgent;
let b: RunningNodeAgent | undefined;

beforeAll(async () => {
  await redis.connect();
  // Node A is this host's usual agent: its template cache has `base` (built by the first test that needed it).
  a = await startTestAgent({ ...A, extraEnv: sharedEnv });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await b?.stop({ killAll: true });
  await a?.stop({ killAll: true });
  for (const setup of [A, B]) await purgeAgent(testConfig(setup)).catch(() => undefined);
  for (const shared of opened) await shared.close();
  const keys = await redis.keys("*");
  // ioredis prefixes DEL's keys itself; KEYS answers them with the prefix.
  if (keys.length > 0) await redis.del(...keys.map((key) => key.slice(prefix.length)));
  redis.disconnect();
  rmSync(tmp, { recursive: true, force: true });
}, 120_000);

describe("shipped templates shared through the store", () => {
  it(
    "a node with an empty cache and another uid base pulls `base` (no build) and starts sandboxes from it",
    async () => {
      const dir = join(tmp, "b-templates");
      b = await startTestAgent({
        ...B,
        extraEnv: { ...sharedEnv, WARREN_TEMPLATES_DIR: dir, WARREN_UID_BASE: String(UID_BASE_B) },
      });
      const baseDir = readdirSync(dir).find((name) => name.startsWith("base-")) as string;
      const manifest = JSON.parse(readFileSync(join(dir, baseDir, "manifest.json"), "utf8"));
      expect(manifest.pulledFrom).toMatchObject({ store: storeUrl, name: a.templates.sharedName("base") });
      expect(manifest.pulledFrom.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
      expect(manifest.builtAt).toBeUndefined();

      // The same bytes as node A's, owners moved into B's range (sudo still setuid).
      const aRoot = (a.templates.ready("base") as { rootfs: string }).rootfs;
      const bRoot = join(dir, baseDir, "rootfs");
      expect(readFileSync(join(bRoot, "var/lib/dpkg/status"))).toEqual(
        readFileSync(join(aRoot, "var/lib/dpkg/status")),
      );
      expect(statSync(join(bRoot, "home/user")).uid).toBe(UID_BASE_B + 1000);
      expect(statSync(join(bRoot, "usr/bin/sudo")).uid).toBe(UID_BASE_B);
      expect(statSync(join(bRoot, "usr/bin/sudo")).mode & 0o4000).toBe(0o4000);

      const template = b.templates.ready("base");
      expect(template).toBeDefined();
      const instance = await b.driver.create({ template: template as never, resources: RECIPES.base.defaults });
      try {
        const sandbox = sdkSandbox("pulled", instance.envdUrl);
        const who = await sandbox.commands.run("id -u; stat -c %u /home/user; sudo -n id -u");
        expect(who.stdout.trim().split("\n")).toEqual(["1000", "1000", "0"]);
      } finally {
        await b.driver.kill(instance.instanceId);
      }
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "two nodes asking for a template the store lacks have it made once: one has it built and publishes, the other pulls",
    async () => {
      const cLines: string[] = [];
      const dLines: string[] = [];
      const c = node("c", 100_000, cLines);
      const d = node("d", 400_000, dLines);
      const [fromC, fromD] = await Promise.all([c.ensure("tiny", noCheck), d.ensure("tiny", noCheck)]);
      const stampC = readFileSync(join(fromC.rootfs, "stamp"), "utf8");
      expect(stampC).toMatch(/^[0-9a-f]{32}$/);
      expect(readFileSync(join(fromD.rootfs, "stamp"), "utf8")).toBe(stampC);
      const built = [...messages(cLines, "tiny"), ...messages(dLines, "tiny")].filter((m) => m === "template built");
      expect(built).toHaveLength(1);
      const pulled = [...messages(cLines, "tiny"), ...messages(dLines, "tiny")].filter(
        (m) => m === "template pulled from the store",
      );
      expect(pulled).toHaveLength(1);
      expect([...messages(cLines, "tiny"), ...messages(dLines, "tiny")]).toContain("template published to the store");
      expect(statSync(join(fromD.rootfs, "opt/suid-true")).uid).toBe(400_000 + 1000);
      expect(statSync(join(fromC.rootfs, "opt/suid-true")).uid).toBe(100_000 + 1000);
      expect(statSync(join(fromD.rootfs, "opt/suid-true")).mode & 0o7777).toBe(0o4755);
      // No claim is left behind, and the store's snapshot list (what the master collects) never shows templates.
      expect(await redis.exists(templateBuildClaimKey(c.sharedName("tiny")))).toBe(0);
      const snapshots = new SnapshotStore(
        { url: storeUrl, insecure: false },
        join(tmp, "list-work"),
        createLogger("t", { level: "error" }),
      );
      const tags = JSON.parse(readFileSync(join(tmp, "store", "index.json"), "utf8")).manifests.map(
        (m: { annotations: Record<string, string> }) => m.annotations["org.opencontainers.image.ref.name"],
      );
      expect(tags).toContain(`template.${c.sharedName("tiny")}`);
      expect(tags).toContain(`template.${c.sharedName("base")}`);
      expect(await snapshots.listPublished()).toEqual([]);
      // Node C takes `base` from the store too (the registry case below offers C's cache).
      await c.ensure("base", noCheck);
      expect(messages(cLines, "base")).toContain("template pulled from the store");
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a copy whose bytes do not match its digest is refused and leaves nothing on the node",
    async () => {
      const store = join(tmp, "store");
      const index = JSON.parse(readFileSync(join(store, "index.json"), "utf8"));
      const name = `template.${node("x", 100_000, []).sharedName("tiny")}`;
      const entry = index.manifests.find(
        (m: { annotations: Record<string, string> }) => m.annotations["org.opencontainers.image.ref.name"] === name,
      );
      const manifest = JSON.parse(readFileSync(join(store, "blobs", entry.digest.replace(":", "/")), "utf8"));
      const layer = join(store, "blobs", manifest.layers[0].digest.replace(":", "/"));
      const original = readFileSync(layer);
      // One byte of the stamp's content (node C has `tiny`): tar still unpacks it.
      const cTiny = readdirSync(join(tmp, "c-templates")).find((n) => n.startsWith("tiny-")) as string;
      const stamp = readFileSync(join(tmp, "c-templates", cTiny, "rootfs", "stamp"));
      const changed = Buffer.from(original);
      const at = original.indexOf(stamp);
      expect(at).toBeGreaterThan(0);
      changed[at] = (changed[at] as number) ^ 1;
      writeFileSync(layer, changed);
      try {
        const lines: string[] = [];
        const e = node("e", 100_000, lines);
        await expect(e.ensure("tiny", noCheck)).rejects.toThrow(/does not match its digest/);
        const left = readdirSync(join(tmp, "e-templates")).filter((n) => n.startsWith("tiny"));
        expect(left).toEqual([]);
      } finally {
        writeFileSync(layer, original);
      }
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a copy of `base` is published as what changed over the store's `base`; nodes put it over their own",
    async () => {
      // Node L (empty cache) pulls `base` and copies it into `layered`: published as a difference over `base`. A
      // copy changes nothing; to see what a layer carries (files added, removed, turned into folders, owners
      // changed), the test changes L's copy between its build and its publish (the ready check runs there).
      const changeCopy = async (image: TemplateImage) => {
        if (image.templateId !== "layered") return;
        const root = image.rootfs;
        writeFileSync(join(root, "stamp"), randomBytes(16).toString("hex"));
        mkdirSync(join(root, "opt"), { recursive: true });
        copyFileSync("/bin/true", join(root, "opt/suid-true"));
        chownSync(join(root, "opt/suid-true"), 101_000, 101_000);
        chmodSync(join(root, "opt/suid-true"), 0o4755);
        rmSync(join(root, "etc/motd"));
        rmSync(join(root, "etc/issue.net"));
        mkdirSync(join(root, "etc/issue.net"));
        writeFileSync(join(root, "etc/issue.net/inner"), "in\n");
        chownSync(join(root, "etc/hostname"), 101_000, 100_000);
      };
      const lLines: string[] = [];
      const l = node("l", 100_000, lLines);
      const built = await l.ensure("layered", changeCopy);
      const published = lLines
        .map((line) => JSON.parse(line))
        .find((e) => e.msg === "template published to the store" && e.templateId === "layered");
      expect(published).toMatchObject({ templateId: "layered", layeredOn: l.sharedName("base") });
      const baseBytes = statSync(blobOf(`template.${l.sharedName("base")}`)).size;
      const layerBytes = statSync(blobOf(`template.${l.sharedName("layered")}`)).size;
      expect(layerBytes).toBeLessThan(baseBytes / 20);

      // Node M (another uid base) pulls `base`, then only the difference, and puts it over its own `base`.
      const mLines: string[] = [];
      const m = node("m", 600_000, mLines);
      const pulled = await m.ensure("layered", noCheck);
      expect(messages(mLines, "layered")).not.toContain("template built");
      const pull = mLines
        .map((line) => JSON.parse(line))
        .find((e) => e.msg === "template pulled from the store" && e.templateId === "layered");
      expect(pull).toMatchObject({ templateId: "layered", layeredOn: m.sharedName("base") });
      const sameTree = (root: string, base: number) => {
        expect(readFileSync(join(root, "stamp"), "utf8")).toBe(readFileSync(join(built.rootfs, "stamp"), "utf8"));
        expect(existsSync(join(root, "etc/motd"))).toBe(false);
        expect(statSync(join(root, "etc/issue.net")).isDirectory()).toBe(true);
        expect(readFileSync(join(root, "etc/issue.net/inner"), "utf8")).toBe("in\n");
        expect(statSync(join(root, "etc/hostname")).uid).toBe(base + 1000);
        expect(statSync(join(root, "etc/hostname")).gid).toBe(base);
        expect(statSync(join(root, "opt/suid-true")).uid).toBe(base + 1000);
        expect(statSync(join(root, "opt/suid-true")).mode & 0o7777).toBe(0o4755);
        expect(statSync(join(root, "usr/bin/sudo")).uid).toBe(base);
        expect(statSync(join(root, "usr/bin/sudo")).mode & 0o4000).toBe(0o4000);
        expect(readFileSync(join(root, "var/lib/dpkg/status"))).toEqual(
          readFileSync(join(built.rootfs, "var/lib/dpkg/status")),
        );
        expect(readdirSync(join(root, "etc")).sort()).toEqual(readdirSync(join(built.rootfs, "etc")).sort());
      };
      sameTree(pulled.rootfs, 600_000);
      sameTree(built.rootfs, 100_000);
      // Node O's uid range overlaps node L's (the publisher's): its `base` moves into L's range under the layer.
      const o = node("o", 130_000, []);
      sameTree((await o.ensure("layered", noCheck)).rootfs, 130_000);

      // Node N's `base` is not the copy `layered` was made over (say it built its own before the cluster shared
      // templates): it unpacks the store's `base` under it instead of using its own.
      const mBase = readdirSync(join(tmp, "m-templates")).find((n) => n.startsWith("base-")) as string;
      const manifestFile = join(tmp, "m-templates", mBase, "manifest.json");
      const manifest = JSON.parse(readFileSync(manifestFile, "utf8"));
      writeFileSync(manifestFile, JSON.stringify({ ...manifest, pulledFrom: { ...manifest.pulledFrom, digest: "x" } }));
      rmSync(
        join(tmp, "m-templates", readdirSync(join(tmp, "m-templates")).find((n) => n.startsWith("layered-")) as string),
        {
          recursive: true,
        },
      );
      const nLines: string[] = [];
      const n = node("n", 600_000, nLines, { cache: "m" });
      const again = await n.ensure("layered", noCheck);
      expect(messages(nLines, "layered")).toContain(
        "this node's copy of the parent is not the one the template was layered on; unpacking that one",
      );
      expect(messages(nLines, "layered")).not.toContain("template built");
      sameTree(again.rootfs, 600_000);
      expect(readdirSync(join(tmp, "m-templates")).filter((name) => name.includes(".tmp-"))).toEqual([]);
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a claim whose holder died expires, and a waiting node builds the template",
    async () => {
      const lines: string[] = [];
      // Node C's cache: it has `base` already.
      const f = node("f", 100_000, lines, { cache: "c" });
      await redis.set(templateBuildClaimKey(f.sharedName("orphan")), "gone-node/0", "PX", 1500);
      const started = Date.now();
      const template = await f.ensure("orphan", noCheck);
      expect(Date.now() - started).toBeGreaterThanOrEqual(1000);
      expect(existsSync(join(template.rootfs, "stamp"))).toBe(true);
      const seen = messages(lines, "orphan");
      expect(seen).toContain("another node is building the template; waiting for it in the store");
      expect(seen).toContain("template built");
      expect(seen).toContain("template published to the store");
      const waited = lines.map((l) => JSON.parse(l)).find((l) => l.msg.startsWith("another node"));
      expect(waited.holder).toBe("gone-node");
      expect(await redis.exists(templateBuildClaimKey(f.sharedName("orphan")))).toBe(0);
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "a changed spec's copy replaces the earlier one in the store once it has been there for the grace period",
    async () => {
      const storeTags = () =>
        JSON.parse(readFileSync(join(tmp, "store", "index.json"), "utf8")).manifests.map(
          (m: { annotations: Record<string, string> }) => m.annotations["org.opencontainers.image.ref.name"],
        ) as string[];
      const changed = { ...SPECS, tiny: specOf("tiny, changed") };
      const before = node("i", 100_000, [], { cache: "c" }).sharedName("tiny");
      // Node C's cache, the new recipe: built and published once; the earlier copy stays while the grace lasts.
      const upgraded = node("i", 100_000, [], { cache: "c", specs: changed });
      const after = upgraded.sharedName("tiny");
      expect(after).not.toBe(before);
      await upgraded.ensure("tiny", noCheck);
      expect(storeTags()).toEqual(expect.arrayContaining([`template.${before}`, `template.${after}`]));
      const lines: string[] = [];
      const restartedEarly = node("j", 100_000, lines, { cache: "c", specs: changed });
      await restartedEarly.ensure("tiny", noCheck);
      await new Promise((resolve) => setTimeout(resolve, 1000));
      expect(storeTags()).toContain(`template.${before}`);
      // A later start (grace over) removes it, and nothing else.
      const laterLines: string[] = [];
      const restarted = node("k", 100_000, laterLines, { cache: "c", specs: changed, graceMs: 0 });
      await restarted.ensure("tiny", noCheck);
      // The log line comes once the removal is whole (a layout drops the tag, then the blobs only it used).
      const removed = await until("the earlier copy removed", 10_000, () =>
        laterLines.map((l) => JSON.parse(l)).find((l) => l.msg.startsWith("earlier recipes' copies")),
      );
      expect(storeTags()).not.toContain(`template.${before}`);
      expect(storeTags()).toEqual(
        expect.arrayContaining([`template.${after}`, `template.${restarted.sharedName("base")}`]),
      );
      expect(removed.removed).toEqual([before]);
    },
    BUILD_TIMEOUT_MS,
  );

  it(
    "through an OCI registry (several hosts): a node's templates are offered, a new node pulls them",
    async () => {
      const registry = await startLoopbackRegistry(join(tmp, "registry"));
      try {
        const url = `docker://${registry.host}/warren`;
        // Node G has `base` and `tiny` built (node C's cache): asking for them offers them to the registry.
        const gLines: string[] = [];
        const g = node("g", 100_000, gLines, { cache: "c", url });
        await g.ensure("base", noCheck);
        const built = await g.ensure("tiny", noCheck);
        // Offering runs in the background (at an agent's start): a node that joins later finds both in the
        // registry. One started before G's offer took its claim would build its own copy instead (CI saw it once).
        await until("node G's templates published", BUILD_TIMEOUT_MS / 2, () => {
          const failed = gLines.find((line) => line.includes("could not be"));
          if (failed) throw new Error(`node G could not offer its templates: ${failed}`);
          return ["base", "tiny"].every((id) => messages(gLines, id).includes("template published to the store"))
            ? true
            : undefined;
        });
        const hLines: string[] = [];
        const h = node("h", 500_000, hLines, { url });
        await h.ensure("base", noCheck);
        const pulled = await h.ensure("tiny", noCheck);
        expect(readFileSync(join(pulled.rootfs, "stamp"), "utf8")).toBe(
          readFileSync(join(built.rootfs, "stamp"), "utf8"),
        );
        expect(statSync(join(pulled.rootfs, "opt/suid-true")).uid).toBe(500_000 + 1000);
        for (const id of ["base", "tiny"]) {
          expect(messages(gLines, id)).toContain("template published to the store");
          expect(messages(hLines, id)).toContain("template pulled from the store");
          expect(messages(hLines, id)).not.toContain("template built");
        }
      } finally {
        registry.process.kill();
      }
    },
    BUILD_TIMEOUT_MS,
  );
});
