import { execFileSync } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import { SHIPPED_BUILD_SPECS } from "../src/templates/shipped-specs.js";
import { BUILD_TIMEOUT_MS, purgeAgent, sdkSandbox, startTestAgent, testConfig } from "./node-agent-harness.js";

const SETUP = { instance: "td", cidr: "10.210.12.0/22" };
const config = testConfig(SETUP);
let running: RunningNodeAgent;

beforeAll(async () => {
  running = await startTestAgent(SETUP);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  await running?.stop({ killAll: true });
  await purgeAgent(config);
}, 120_000);

describe("shipped templates on the node (no Docker)", () => {
  it("base is cached by content hash: asking again reuses the build without a rebuild or a new ready check", async () => {
    let checks = 0;
    const again = await running.templates.ensure("base", async () => {
      checks++;
    });
    expect(checks).toBe(0);
    expect(again.hash).toBe(running.templates.hash("base"));
    expect(again.rootfs).toContain(`base-${again.hash}`);
    const manifest = await running.templates.manifest("base");
    expect(manifest).toMatchObject({ id: "base", hash: again.hash });
    // Made by the master's template builder from `base`'s spec (the prebuild cluster of vitest's global setup).
    expect((manifest.builder as { spec: unknown }).spec).toEqual(SHIPPED_BUILD_SPECS.base);
  });

  it("template files belong to the sandbox uid range (root → 100000, user → 101000) and sudo stays setuid", () => {
    const rootfs = running.templates.ready("base")!.rootfs;
    const sudo = statSync(join(rootfs, "usr/bin/sudo"));
    expect(sudo.uid).toBe(100000);
    expect(sudo.mode & 0o4000).toBe(0o4000);
    expect(statSync(join(rootfs, "home/user")).uid).toBe(101000);
    const lowIds = execFileSync(
      "find",
      [rootfs, "-xdev", "(", "-uid", "-65536", "-o", "-gid", "-65536", ")", "-print", "-quit"],
      {
        encoding: "utf8",
      },
    );
    expect(lowIds).toBe("");
  });

  it(
    "code-interpreter-v1 (its own Debian base) has python3 with the Jupyter stack, node, sudo and the code gateway on 49999",
    async () => {
      const template = await running.agent.ensureTemplate("code-interpreter-v1");
      const manifest = (await running.templates.manifest("code-interpreter-v1")) as {
        builder: { spec: { fromDebian: { packages: string[]; aptPackages: string[] } } };
      };
      expect(manifest.builder.spec.fromDebian.aptPackages).toContain("python3-ipykernel");
      expect(manifest.builder.spec.fromDebian.packages).toEqual(SHIPPED_BUILD_SPECS.base.fromDebian.packages);
      expect(template.hash).not.toBe(running.templates.hash("base"));
      expect(template.codeGateway).toBe(true);
      expect(running.templates.ready("base")?.codeGateway).toBe(false);
      const placement = await running.agent.create({
        sandboxId: "tplci",
        teamId: "team-t",
        templateId: "code-interpreter-v1",
        envdAccessToken: "tok",
      });
      try {
        const sandbox = sdkSandbox("tplci", placement.envdUrl, "tok");
        const check = await sandbox.commands.run(
          "/usr/bin/python3 -c 'import ipykernel, jupyter_client, numpy, pandas, matplotlib; print(\"ok\")' && node -e 'console.log(process.version)' && sudo -n true && git --version && curl --version | head -1",
          { timeoutMs: 60_000 },
        );
        const lines = check.stdout.trim().split("\n");
        expect(lines[0]).toBe("ok");
        expect(lines[1]).toBe(process.version);
        expect(lines[2]).toMatch(/^git version/);
        expect(lines[3]).toMatch(/^curl /);
        // The code gateway is up (the sandbox counted as ready only once it answered) and reached envd.
        const gateway = new URL(placement.envdUrl);
        gateway.port = "49999";
        const health = await fetch(new URL("/health", gateway));
        expect(health.status).toBe(200);
        const run = await fetch(new URL("/execute", gateway), {
          method: "POST",
          headers: { "Content-Type": "application/json", "X-Access-Token": "tok" },
          body: JSON.stringify({ code: "import os; os.getuid(), os.getcwd()" }),
        });
        expect(run.status).toBe(200);
        expect(await run.text()).toContain("(0, '/home/user')");
      } finally {
        await running.agent.kill("tplci");
      }
    },
    BUILD_TIMEOUT_MS,
  );
});
