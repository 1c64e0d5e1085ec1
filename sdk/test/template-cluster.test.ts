import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalCluster } from "@warren/local";
import * as e2b from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BuildError, type LogEntry, Sandbox, Template, waitForFile } from "../src/index.js";
import { cleanEnv, warren } from "./cli-harness.js";

// Custom templates against a whole Warren cluster: built with Warren's SDK, with the official `e2b` SDK and with
// the CLI, then used by `Sandbox.create(name)`. Needs the api's template endpoints (E2B-TEMPLATES.md §2).

const dataDir = mkdtempSync(join(tmpdir(), "warren-sdk-templates-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "sm",
  nodeCidr: () => "10.226.0.0/22",
});
let opts: { apiKey: string; apiUrl: string; sandboxUrl: string };
const ctx = mkdtempSync(join(tmpdir(), "warren-tpl-cluster-ctx-"));
const cliEnv = () => cleanEnv({ WARREN_DATA_DIR: dataDir });
const unique = (name: string) => `${name}-${Date.now().toString(36)}`;
const BUILD_TIMEOUT = 600_000;

beforeAll(async () => {
  const env = await cluster.start();
  cluster.writeEnvFile(join(dataDir, "env"));
  opts = { apiKey: env.WARREN_API_KEY, apiUrl: env.WARREN_API_URL, sandboxUrl: env.WARREN_PROXY_URL };
  writeFileSync(join(ctx, "hello.txt"), "hello from the context\n");
  writeFileSync(
    join(ctx, "Dockerfile"),
    "FROM e2bdev/base\nRUN echo from-dockerfile > /tmp/df\nCOPY hello.txt /home/user/\n",
  );
}, 900_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(ctx, { recursive: true, force: true });
}, 180_000);

async function readInSandbox(template: string, paths: string[]): Promise<string[]> {
  const sandbox = await Sandbox.create(template, { ...opts, timeoutMs: 120_000 });
  try {
    return await Promise.all(paths.map((p) => sandbox.files.read(p)));
  } finally {
    await sandbox.kill();
  }
}

describe("custom templates on a whole cluster", () => {
  it(
    "Warren's SDK builds fromTemplate('base') + runCmd + copy; a sandbox from it has both effects",
    async () => {
      const name = unique("sdk-tpl");
      const logs: LogEntry[] = [];
      const template = Template({ fileContextPath: ctx })
        .fromTemplate("base")
        .runCmd("echo hi > /tmp/x")
        .copy("hello.txt", "/home/user/hello.txt");
      const info = await Template.build(template, `${name}:v1`, { ...opts, onBuildLogs: (e) => logs.push(e) });
      expect(info).toMatchObject({ name: `${name}:v1`, tags: expect.arrayContaining(["v1"]) });
      expect(logs.some((l) => l.message.includes("RUN echo hi > /tmp/x"))).toBe(true);

      expect(await Template.exists(name, opts)).toBe(true);
      expect(await Template.exists(`${name}:v1`, opts)).toBe(true);
      expect(await Template.exists(unique("never-built"), opts)).toBe(false);
      expect(await readInSandbox(`${name}:v1`, ["/tmp/x", "/home/user/hello.txt"])).toEqual([
        "hi\n",
        "hello from the context\n",
      ]);
      // Built as name:v1 only, so there is no `default` tag.
      await expect(Sandbox.create(name, opts)).rejects.toThrow(/tag 'default' does not exist/);

      const tagged = await Template.assignTags(`${name}:v1`, "stable", opts);
      expect(tagged.buildId).toBe(info.buildId);
      const tags = await Template.getTags(name, opts);
      expect(tags.map((t) => t.tag)).toEqual(expect.arrayContaining(["v1", "stable"]));
      expect(await readInSandbox(`${name}:stable`, ["/tmp/x"])).toEqual(["hi\n"]);
      await Template.removeTags(name, "stable", opts);
      expect((await Template.getTags(name, opts)).map((t) => t.tag)).not.toContain("stable");

      expect(await Template.delete(name, opts)).toBe(true);
      expect(await Template.exists(name, opts)).toBe(false);
    },
    BUILD_TIMEOUT,
  );

  it(
    "a build id works where a tag is expected, and an id where a name is",
    async () => {
      const name = unique("by-id-tpl");
      const template = Template({ fileContextPath: ctx }).fromTemplate("base").runCmd("echo by-id > /tmp/id");
      const info = await Template.build(template, name, opts);
      expect(await readInSandbox(`${name}:${info.buildId}`, ["/tmp/id"])).toEqual(["by-id\n"]);
      expect(await readInSandbox(info.templateId, ["/tmp/id"])).toEqual(["by-id\n"]);
    },
    BUILD_TIMEOUT,
  );

  it(
    "the official e2b SDK builds against Warren the same way",
    async () => {
      const name = unique("e2b-tpl");
      const template = e2b
        .Template({ fileContextPath: ctx })
        .fromTemplate("base")
        .runCmd("echo from-e2b > /tmp/e")
        .copy("hello.txt", "/home/user/")
        .setEnvs({ GREETING: "hi" });
      const info = await e2b.Template.build(template, name, { apiKey: opts.apiKey, apiUrl: opts.apiUrl });
      expect(info.templateId).toMatch(/^[a-z0-9]+$/);
      expect(await e2b.Template.exists(name, { apiKey: opts.apiKey, apiUrl: opts.apiUrl })).toBe(true);
      expect(await readInSandbox(name, ["/tmp/e", "/home/user/hello.txt"])).toEqual([
        "from-e2b\n",
        "hello from the context\n",
      ]);
    },
    BUILD_TIMEOUT,
  );

  it(
    "a start command runs in every sandbox, ready before create returns",
    async () => {
      const name = unique("start-tpl");
      const template = Template({ fileContextPath: ctx })
        .fromTemplate("base")
        .setStartCmd("sh -c 'sleep 1; date > /tmp/started'", waitForFile("/tmp/started"));
      await Template.build(template, name, opts);
      const [started] = await readInSandbox(name, ["/tmp/started"]);
      expect(started).toMatch(/\d/);
    },
    BUILD_TIMEOUT,
  );

  it(
    "a failing step fails the build with BuildError carrying the reason",
    async () => {
      const template = Template({ fileContextPath: ctx }).fromTemplate("base").runCmd("echo out; exit 3");
      const error = await Template.build(template, unique("broken-tpl"), opts).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(BuildError);
      expect((error as Error).message).not.toBe("");
    },
    BUILD_TIMEOUT,
  );

  it(
    "the CLI builds from a Dockerfile (--json) and lists, shows, tags and deletes the template",
    async () => {
      const name = unique("cli-tpl");
      const built = await warren(["template", "build", name, "--context", ctx, "--json"], cliEnv(), BUILD_TIMEOUT);
      expect(built.code, built.stderr).toBe(0);
      const info = JSON.parse(built.stdout) as { templateId: string; buildId: string; status: string };
      expect(info.status).toBe("ready");
      expect(await readInSandbox(name, ["/tmp/df", "/home/user/hello.txt"])).toEqual([
        "from-dockerfile\n",
        "hello from the context\n",
      ]);

      const list = await warren(["template", "list", "--json"], cliEnv());
      expect(list.code, list.stderr).toBe(0);
      expect(JSON.parse(list.stdout)).toContainEqual(expect.objectContaining({ templateId: info.templateId }));
      const shown = await warren(["template", "info", name, "--json"], cliEnv());
      expect(shown.code, shown.stderr).toBe(0);
      expect(JSON.parse(shown.stdout)).toMatchObject({ templateId: info.templateId });

      const assigned = await warren(["template", "tags", name, "--assign", "prod", "--json"], cliEnv());
      expect(assigned.code, assigned.stderr).toBe(0);
      const tags = await warren(["template", "tags", name, "--json"], cliEnv());
      expect((JSON.parse(tags.stdout) as { tag: string }[]).map((t) => t.tag)).toEqual(
        expect.arrayContaining(["default", "prod"]),
      );

      const deleted = await warren(["template", "delete", name], cliEnv());
      expect(deleted).toMatchObject({ code: 0, stdout: `deleted ${name}\n` });
      expect((await warren(["template", "info", name], cliEnv())).code).toBe(6);
    },
    BUILD_TIMEOUT,
  );

  it(
    "the CLI builds a template file with a start command",
    async () => {
      const name = unique("cli-file-tpl");
      const file = join(ctx, "template.json");
      writeFileSync(
        file,
        JSON.stringify({
          fromTemplate: "base",
          steps: [{ type: "COPY", args: ["hello.txt", "/home/user/copied.txt"] }],
        }),
      );
      const res = await warren(
        [
          "template",
          "build",
          name,
          "--template-file",
          file,
          "--context",
          ctx,
          "--start-cmd",
          "touch /tmp/up",
          "--ready-cmd",
          "test -f /tmp/up",
          "--json",
        ],
        cliEnv(),
        BUILD_TIMEOUT,
      );
      expect(res.code, res.stderr).toBe(0);
      expect(await readInSandbox(name, ["/home/user/copied.txt", "/tmp/up"])).toEqual(["hello from the context\n", ""]);
    },
    BUILD_TIMEOUT,
  );
});
