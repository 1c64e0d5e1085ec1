import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SHIPPED_BUILD_SPECS } from "@warren/control-plane/dist/templates/shipped-specs.js";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { Sandbox } from "e2b";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// The template builder's Debian base (the base of Warren's own recipes, here `base`'s): a build whose stored spec says
// `fromDebian` has the node make the suite's minimal system and packages with debootstrap (host-side, as an image
// pull), prepared for envd as images are; its steps then run in a build sandbox like any build's, and the base is a
// cached layer. A request cannot ask for it: the api parses E2B's body, which has no such field.
const dataDir = mkdtempSync(join(tmpdir(), "warren-deb-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "ds",
  nodeCidr: () => "10.204.0.0/22",
});
let env: ClusterEnv;
let db: pg.Client;
const created: Sandbox[] = [];

beforeAll(async () => {
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
  db = new pg.Client({ connectionString: cluster.databaseUrl });
  await db.connect();
  await db.query(`SET search_path TO ${cluster.dbSchema}`);
}, 600_000);

afterAll(async () => {
  await Promise.all(created.map((s) => s.kill().catch(() => undefined)));
  await db?.end();
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

async function api(path: string, init: RequestInit = {}): Promise<Response> {
  return fetch(`${env.E2B_API_URL}${path}`, {
    ...init,
    headers: { "X-API-Key": env.E2B_API_KEY, "Content-Type": "application/json", ...init.headers },
  });
}

interface BuildStatus {
  status: string;
  reason?: { message: string; step?: string };
  logs: string[];
}

/**
 * A build of `spec` (a stored spec, as Warren's recipes will write it) for a new template `name`: created through
 * E2B's API, its spec stored as the api stores a request's, then started through the master's StartTemplateBuild.
 */
async function build(name: string, spec: Record<string, unknown>): Promise<{ templateID: string } & BuildStatus> {
  const res = await api("/v3/templates", {
    method: "POST",
    body: JSON.stringify({ name, cpuCount: 1, memoryMB: 512 }),
  });
  expect(res.status).toBe(202);
  const { templateID, buildID } = (await res.json()) as { templateID: string; buildID: string };
  const row = await db.query("UPDATE template_builds SET spec = $2 WHERE id = $1 RETURNING team_id", [
    buildID,
    JSON.stringify(spec),
  ]);
  const teamId = row.rows[0]?.team_id as string;
  const started = await fetch(`${cluster.masterUrl}/warren.master.v1.MasterService/StartTemplateBuild`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ teamId, templateId: templateID, buildId: buildID }),
  });
  expect(started.status, await started.clone().text()).toBe(200);
  const logs: string[] = [];
  const deadline = Date.now() + 480_000;
  for (;;) {
    const status = await api(`/templates/${templateID}/builds/${buildID}/status?logsOffset=${logs.length}`);
    const body = (await status.json()) as {
      status: string;
      reason?: { message: string; step?: string };
      logEntries: { message: string }[];
    };
    logs.push(...body.logEntries.map((e) => e.message));
    if ((body.status === "ready" || body.status === "error") && body.logEntries.length === 0) {
      return { templateID, status: body.status, ...(body.reason ? { reason: body.reason } : {}), logs };
    }
    if (Date.now() > deadline) throw new Error(`build ${buildID} still ${body.status}:\n${logs.join("\n")}`);
    await new Promise((r) => setTimeout(r, body.logEntries.length === 100 ? 0 : 500));
  }
}

const BASE_SPEC = SHIPPED_BUILD_SPECS.base;
const DEBIAN = BASE_SPEC.fromDebian;

/** What a sandbox looks like from inside to E2B's users and to Warren: run as the default user. */
const PROBE = [
  "id",
  'echo "$HOME $(pwd) $SHELL"',
  "getent passwd user",
  "sudo -n true && echo sudo-ok",
  "cat /etc/hostname /etc/hosts",
  "grep -c 'EUID:-' /etc/profile",
  "sudo grep -c 'if \\[ -t 0 \\]; then mesg n' /root/.profile",
  "for t in sudo curl ss pgrep inotifywait git python3 python tini node; do command -v $t > /dev/null && echo have-$t || echo missing-$t; done",
  // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's format, not a JavaScript template.
  "dpkg-query -W -f '${Package}\\n' | sort | sha256sum",
  "ls -A /var/lib/apt/lists /var/cache/apt/archives | grep -c '\\.deb$\\|_Packages$' || true",
  "stat -c '%U %a %n' /home/user /etc/sudoers.d/user /tmp /opt/warren/bin/node",
].join(" && ");

describe("a template built from a Debian system the node makes", () => {
  it("`base`'s spec built as a team's template: the steps run in a build sandbox over the debootstrapped base, and its sandboxes look like the shipped base's", async () => {
    const built = await build("deb-base", BASE_SPEC as unknown as Record<string, unknown>);
    expect(built.status, built.logs.join("\n")).toBe("ready");
    const log = built.logs.join("\n");
    expect(log).toContain(`FROM debian:bookworm (debootstrap + ${new Set(DEBIAN.packages).size} packages)`);
    expect(log).toMatch(/debian:bookworm \(debootstrap from \S+\)@sha256:[0-9a-f]{64}/);
    expect(log).toMatch(/rootfs ready: \d+ packages/);

    const fromBuilder = await Sandbox.create(built.templateID, { timeoutMs: 120_000 });
    const shipped = await Sandbox.create("base", { timeoutMs: 120_000 });
    created.push(fromBuilder, shipped);
    expect((await fromBuilder.commands.run("grep VERSION_CODENAME /etc/os-release")).stdout.trim()).toBe(
      "VERSION_CODENAME=bookworm",
    );
    const probe = async (sandbox: Sandbox) => {
      const result = await sandbox.commands.run(PROBE).catch((e: { stdout?: string; stderr?: string }) => e);
      return `${result.stdout ?? ""}${result.stderr ?? ""}`;
    };
    const ours = await probe(fromBuilder);
    // Every probe ran (they are chained with &&): from the first to the last.
    expect(ours).toMatch(/^uid=1000\(user\) gid=1000\(user\)/);
    expect(ours).toContain("sudo-ok");
    expect(ours).toContain("have-tini");
    expect(ours).not.toContain("missing-");
    expect(ours).toMatch(/^[0-9a-f]{64} {2}-$/m);
    expect(ours).toMatch(/^user 755 \/home\/user$/m);
    expect(ours).toMatch(/ \/opt\/warren\/bin\/node$/m);
    expect(ours).toBe(await probe(shipped));
    await Promise.all([fromBuilder.kill(), shipped.kill()]);
  }, 600_000);

  it("the same suite and packages, in another order, are the cached base layer", async () => {
    const built = await build("deb-b", {
      fromDebian: { suite: "bookworm", packages: [...DEBIAN.packages].reverse().concat(DEBIAN.packages[0] ?? "") },
      force: false,
      startCmd: null,
      readyCmd: null,
      steps: [{ type: "RUN", args: ["touch /etc/second", "root"], force: false }],
    });
    expect(built.status, built.logs.join("\n")).toBe("ready");
    const log = built.logs.join("\n");
    expect(log).toContain(
      `CACHED [base] FROM debian:bookworm (debootstrap + ${new Set(DEBIAN.packages).size} packages)`,
    );
    expect(log).not.toContain("making a Debian system");
  }, 300_000);

  it("a package name debootstrap must never see fails the build at its base, naming the name", async () => {
    const built = await build("deb-c", {
      fromDebian: { suite: "bookworm", packages: ["tini", "--foreign"] },
      force: false,
      startCmd: null,
      readyCmd: null,
      steps: [],
    });
    expect(built.status).toBe("error");
    expect(built.reason?.message).toContain("'--foreign' is not a Debian package name");
    expect(built.reason?.step).toBe("base");
  }, 120_000);

  it("E2B's build request cannot ask for a Debian base", async () => {
    const res = await api("/v3/templates", { method: "POST", body: JSON.stringify({ name: "deb-d" }) });
    const { templateID, buildID } = (await res.json()) as { templateID: string; buildID: string };
    const trigger = await api(`/v2/templates/${templateID}/builds/${buildID}`, {
      method: "POST",
      body: JSON.stringify({ fromDebian: DEBIAN, steps: [] }),
    });
    expect(trigger.status).toBe(400);
    expect(await trigger.text()).toContain("one of fromImage or fromTemplate is required");
  });
});
