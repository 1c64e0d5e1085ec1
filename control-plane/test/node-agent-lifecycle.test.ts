import { readFileSync } from "node:fs";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ExportSnapshotRequestSchema } from "@warren/proto/nodeagent/v1/node_agent_pb";
import { nodeKey, routeKey } from "@warren/proto/redis";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningNodeAgent } from "../src/node-agent/node-agent.js";
import {
  agentClient,
  BUILD_TIMEOUT_MS,
  hostFootprint,
  NO_TRACES,
  purgeAgent,
  sdkSandbox,
  slotOf,
  startTestAgent,
  testConfig,
  tracesAfterReclaim,
  tracesOf,
} from "./node-agent-harness.js";

// No warm pool and no network pool: every resource on the host belongs to a sandbox a test created, so
// "nothing left behind" can be checked exactly.
const SETUP = { instance: "ta", cidr: "10.210.0.0/22" };
const config = testConfig(SETUP);
const redis = new Redis(config.redisUrl);
let running: RunningNodeAgent;
let client: ReturnType<typeof agentClient>;
const created = new Set<string>();

async function createSandbox(sandboxId: string, extra: Record<string, unknown> = {}) {
  const response = await client.create({
    sandboxId,
    teamId: "team-a",
    templateId: "base",
    envdAccessToken: `token-${sandboxId}`,
    ...extra,
  });
  created.add(sandboxId);
  return response;
}

async function killSandbox(sandboxId: string) {
  await client.kill({ sandboxId });
  created.delete(sandboxId);
}

async function connectCode(call: Promise<unknown>): Promise<Code | undefined> {
  try {
    await call;
    return undefined;
  } catch (error) {
    return ConnectError.from(error).code;
  }
}

beforeAll(async () => {
  running = await startTestAgent(SETUP);
  client = agentClient(running);
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const id of created) await client.kill({ sandboxId: id }).catch(() => undefined);
  await running?.stop({ killAll: true });
  await purgeAgent(config);
  redis.disconnect();
}, 120_000);

describe("node agent sandbox lifecycle (namespace driver)", () => {
  it("create → envd answers → the e2b SDK runs `id -un` as `user`, with env vars from /init", async () => {
    const placement = await createSandbox("lifesdk", { envVars: { WARREN_GREETING: "hello" } });
    expect(placement.envdUrl).toBe(`http://${placement.sandboxAddr}:49983`);
    expect(placement.envdVersion).toBe("0.6.4");
    const sandbox = sdkSandbox("lifesdk", placement.envdUrl, "token-lifesdk");
    const who = await sandbox.commands.run("id -un");
    expect(who.stdout.trim()).toBe("user");
    const env = await sandbox.commands.run("echo $WARREN_GREETING; pwd");
    expect(env.stdout.trim().split("\n")).toEqual(["hello", "/home/user"]);
    const route = await redis.hgetall(routeKey("lifesdk"));
    expect(route).toMatchObject({
      exec: placement.exec,
      node: config.nodeId,
      sandboxAddr: placement.sandboxAddr,
      state: "running",
      team: "team-a",
    });
  });

  it("envd requires the access token given at create", async () => {
    const placement = await createSandbox("lifetoken");
    const wrong = sdkSandbox("lifetoken", placement.envdUrl, "not-the-token");
    await expect(wrong.commands.run("true")).rejects.toThrow();
    const right = sdkSandbox("lifetoken", placement.envdUrl, "token-lifetoken");
    expect((await right.commands.run("true")).exitCode).toBe(0);
  });

  it("`user` has passwordless sudo, and sandbox root is host uid 100000 (user namespace)", async () => {
    const placement = await createSandbox("lifesudo");
    const sandbox = sdkSandbox("lifesudo", placement.envdUrl, "token-lifesudo");
    const root = await sandbox.commands.run("sudo -n id -u && sudo -n cat /proc/self/uid_map");
    const [uid, map] = root.stdout.trim().split("\n");
    expect(uid).toBe("0");
    expect(map?.trim().split(/\s+/)).toEqual(["0", "100000", "65536"]);
    const seccomp = await sandbox.commands.run("grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status");
    expect(seccomp.stdout).toMatch(/Seccomp:\s+2/);
  });

  it("a login shell's profile runs no command (every command is `bash -l -c`), and still sets root's and user's PATH", async () => {
    const placement = await createSandbox("lifeprofile");
    const sandbox = sdkSandbox("lifeprofile", placement.envdUrl, "token-lifeprofile");
    // xtrace from the start: the profiles' own commands show too (Debian's asked `id -u` twice, root's ran `mesg`).
    for (const user of ["user", "root"] as const) {
      const traced = await sandbox.commands.run("bash -lx -c true", { user });
      expect(traced.stderr).toContain("+ export PATH");
      expect(traced.stderr).not.toMatch(/\bid -u\b|\bmesg\b/);
    }
    expect((await sandbox.commands.run("echo $PATH")).stdout.trim()).toBe(
      "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
    );
    expect((await sandbox.commands.run("echo $PATH", { user: "root" })).stdout.trim()).toBe(
      "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    // sh has no EUID: it still asks id, and gets the same answer.
    expect((await sandbox.commands.run("sh -l -c 'echo $PATH'")).stdout.trim()).toBe(
      "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games",
    );
  });

  it("any port a sandbox process listens on (including a port below 1024, as `user`) is reachable from the node", async () => {
    const placement = await createSandbox("lifeports");
    const sandbox = sdkSandbox("lifeports", placement.envdUrl, "token-lifeports");
    await sandbox.files.write("/home/user/www/index.html", "hello from the sandbox");
    for (const port of [8080, 80]) {
      await sandbox.commands.run(`cd /home/user/www && exec python3 -m http.server ${port} --bind 0.0.0.0`, {
        background: true,
      });
      let body = "";
      for (let attempt = 0; attempt < 200 && body === ""; attempt++) {
        body = await fetch(`http://${placement.sandboxAddr}:${port}/index.html`)
          .then((res) => (res.ok ? res.text() : ""))
          .catch(() => "");
        if (body === "") await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(body, `port ${port}`).toBe("hello from the sandbox");
    }
  });

  it("the driver's freezer pause stops every process and resume brings the sandbox back", async () => {
    const placement = await createSandbox("lifefreeze");
    const { instanceId } = running.agent.get("lifefreeze")!;
    const state = () =>
      readFileSync(`/sys/fs/cgroup/freezer/warren/${config.instance}/${instanceId}/freezer.state`, "utf8").trim();
    await running.driver.pause(instanceId);
    expect(state()).toBe("FROZEN");
    expect(running.driver.list().find((i) => i.instanceId === instanceId)?.paused).toBe(true);
    await running.driver.resume(instanceId);
    expect(state()).toBe("THAWED");
    const sandbox = sdkSandbox("lifefreeze", placement.envdUrl, "token-lifefreeze");
    expect((await sandbox.commands.run("echo awake")).stdout.trim()).toBe("awake");
  });

  it("killing a frozen sandbox: its processes never run again, die at the thaw, and nothing is left", async () => {
    const placement = await createSandbox("lifefrozenkill");
    const { instanceId } = running.agent.get("lifefrozenkill")!;
    const sandbox = { sandboxId: "lifefrozenkill", instanceId, slot: slotOf(config.netCidr, placement.sandboxAddr) };
    const freezer = `/sys/fs/cgroup/freezer/warren/${config.instance}/${instanceId}`;
    await running.driver.pause(instanceId);
    const frozen = readFileSync(`${freezer}/cgroup.procs`, "utf8").split("\n").filter(Boolean);
    expect(frozen.length).toBeGreaterThan(0);
    await killSandbox("lifefrozenkill");
    for (const pid of frozen) expect(killedOrGone(pid), `pid ${pid}`).toBe(true);
    expect(await tracesAfterReclaim(config, sandbox, redis)).toEqual(NO_TRACES);
    // Thawed by the teardown, they died (gone, or a zombie until whatever reaps it does).
    const stateOf = (pid: string) => {
      try {
        return /^State:\s+(\w)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
      } catch {
        return "gone";
      }
    };
    for (const pid of frozen) expect(["gone", "Z", "X"], `pid ${pid}`).toContain(stateOf(pid));
  });

  it("files written in one sandbox are invisible to another", async () => {
    const a = await createSandbox("lifefilesa");
    const b = await createSandbox("lifefilesb");
    const sa = sdkSandbox("lifefilesa", a.envdUrl, "token-lifefilesa");
    const sb = sdkSandbox("lifefilesb", b.envdUrl, "token-lifefilesb");
    await sa.files.write("/home/user/secret.txt", "only in a");
    await sa.commands.run("sudo -n sh -c 'echo root-only > /etc/only-in-a'");
    expect(await sa.files.read("/home/user/secret.txt")).toBe("only in a");
    expect(await sb.files.exists("/home/user/secret.txt")).toBe(false);
    const look = await sb.commands.run("ls /etc/only-in-a 2>&1 || true");
    expect(look.stdout).toMatch(/No such file/);
  });

  it("kill deletes the route and leaves no mount, cgroup, netns, veth, firewall rule, crun state or file", async () => {
    const placement = await createSandbox("lifekill");
    const summary = running.agent.get("lifekill")!;
    const sandbox = {
      sandboxId: "lifekill",
      instanceId: summary.instanceId,
      slot: slotOf(config.netCidr, placement.sandboxAddr),
    };
    const before = await tracesOf(config, sandbox, redis);
    expect(before.netns && before.veth && before.route && before.files).toBe(true);
    expect(before.cgroups.length).toBeGreaterThan(0);
    expect(before.mounts.length).toBe(2);
    // Input: replies, drop; forward: not to either driver's sandboxes (2), not link-local, its own address out,
    // drop; replies in, drop.
    expect(before.rules.length).toBe(9);
    // Forking all the time when the kill comes: the kill reads the list again until it holds no process it has not
    // killed (a child forked before its parent's kill shows up in the next read), without freezing the sandbox.
    const sdk = sdkSandbox("lifekill", placement.envdUrl, "token-lifekill");
    await sdk.commands.run("while :; do /bin/true & wait; done", { background: true });
    await sdk.commands.run("sleep 0.2");
    await killSandbox("lifekill");
    // When the kill answers: unreachable (no route), stopped (no process), forgotten; the rest follows at once.
    const atKill = await tracesOf(config, sandbox, redis);
    expect(atKill.route).toBe(false);
    for (const cgroup of atKill.cgroups) {
      // Read while the reclaim removes it: a cgroup already gone holds no process either. A process still listed
      // has its SIGKILL and is on its way out: it never runs its own code again.
      const procs = (() => {
        try {
          return readFileSync(`${cgroup}/cgroup.procs`, "utf8").split("\n").filter(Boolean);
        } catch {
          return [];
        }
      })();
      for (const pid of procs) expect(killedOrGone(pid), `pid ${pid} of ${cgroup}`).toBe(true);
    }
    expect(running.agent.get("lifekill")).toBeUndefined();
    expect(await tracesAfterReclaim(config, sandbox, redis)).toEqual(NO_TRACES);
    expect(await connectCode(client.kill({ sandboxId: "lifekill" }))).toBe(Code.NotFound);
  });

  it("a create that fails halfway (envd never starts) leaves nothing behind", async () => {
    const before = hostFootprint(config);
    await expect(
      running.agent.create({ sandboxId: "lifebroken", teamId: "team-a", templateId: "base", command: ["/bin/false"] }),
    ).rejects.toThrow(/failed to start/);
    expect(hostFootprint(config)).toEqual(before);
    expect(await redis.exists(routeKey("lifebroken"))).toBe(0);
    expect(running.agent.get("lifebroken")).toBeUndefined();
  });

  it("bad input gets clear Connect errors: unknown template, absurd resources, duplicate id, invalid id", async () => {
    expect(await connectCode(client.create({ sandboxId: "lifebad1", templateId: "no-such-template" }))).toBe(
      Code.NotFound,
    );
    expect(
      await connectCode(
        client.create({ sandboxId: "lifebad2", templateId: "base", resources: { memoryMb: 10_000_000 } }),
      ),
    ).toBe(Code.InvalidArgument);
    expect(
      await connectCode(client.create({ sandboxId: "lifebad3", templateId: "base", resources: { cpuCount: -1 } })),
    ).toBe(Code.InvalidArgument);
    expect(await connectCode(client.create({ sandboxId: "Not A Valid Id!", templateId: "base" }))).toBe(
      Code.InvalidArgument,
    );
    await createSandbox("lifedup");
    expect(await connectCode(client.create({ sandboxId: "lifedup", templateId: "base" }))).toBe(Code.AlreadyExists);
    // A template that requires a microVM: refused by this namespace node, which does not list it as servable.
    const vmOnly = client.create({ sandboxId: "lifebad4", templateId: "base-vm" });
    await expect(vmOnly).rejects.toThrow(
      /template 'base-vm' runs only on microvm nodes; this node's driver is namespace/,
    );
    expect(await connectCode(client.create({ sandboxId: "lifebad4", templateId: "base-vm" }))).toBe(
      Code.FailedPrecondition,
    );
    expect(running.agent.info().servable).not.toContain("base-vm");
    expect(running.agent.info().servable).toContain("base");
    expect(await connectCode(client.pause({ sandboxId: "lifenobody", memory: true }))).toBe(Code.NotFound);
    expect(await connectCode(client.resume({ sandboxId: "lifenobody", memory: true }))).toBe(Code.NotFound);
    expect(await connectCode(client.stats({ sandboxId: "lifenobody" }))).toBe(Code.NotFound);
  });

  it("List and Stats report the sandbox, its limits and its usage", async () => {
    await createSandbox("lifestats", { resources: { memoryMb: 256, cpuCount: 0.5, diskSizeMb: 128 } });
    const list = await client.list({});
    const entry = list.sandboxes.find((s) => s.sandboxId === "lifestats");
    expect(entry?.resources).toMatchObject({ memoryMb: 256, cpuCount: 0.5, diskSizeMb: 128 });
    const stats = await client.stats({ sandboxId: "lifestats" });
    expect(stats.memoryLimitBytes).toBe(256n * 1024n * 1024n);
    expect(stats.memoryUsageBytes).toBeGreaterThan(0n);
    expect(stats.pids).toBeGreaterThan(0);
    expect(stats.diskLimitBytes).toBe(128n * 1024n * 1024n);
  });

  it("heartbeats publish the node's capacity in Redis under a key with a TTL", async () => {
    const key = nodeKey(config.nodeId);
    const beat = await redis.hgetall(key);
    expect(beat).toMatchObject({ nodeId: config.nodeId, driver: "namespace", addr: `127.0.0.1:${running.port}` });
    expect(Number(beat.cpuCount)).toBeGreaterThan(0);
    expect(JSON.parse(beat.templates ?? "[]")).toContain("base");
    const ttl = await redis.ttl(key);
    expect(ttl).toBeGreaterThan(0);
    expect(await redis.sismember("warren:nodes", config.nodeId)).toBe(1);
  });

  it("a snapshot's stream goes out plain to a client that offers gzip (gzipping it made moves 5× slower)", async () => {
    await createSandbox("lifeplain");
    await client.snapshot({ sandboxId: "lifeplain", snapshotId: "lifeplainsnap", filesOnly: true });
    try {
      const request = toBinary(
        ExportSnapshotRequestSchema,
        create(ExportSnapshotRequestSchema, { snapshotId: "lifeplainsnap" }),
      );
      const envelope = Buffer.alloc(5 + request.length);
      envelope.writeUInt32BE(request.length, 1);
      envelope.set(request, 5);
      const res = await fetch(`http://127.0.0.1:${running.port}/warren.nodeagent.v1.NodeAgentService/ExportSnapshot`, {
        method: "POST",
        headers: { "content-type": "application/connect+proto", "connect-accept-encoding": "gzip" },
        body: envelope,
      });
      expect(res.status).toBe(200);
      expect(res.headers.get("connect-content-encoding") ?? "identity").toBe("identity");
      const body = Buffer.from(await res.arrayBuffer());
      let messages = 0;
      for (let at = 0; at < body.length; at += 5 + body.readUInt32BE(at + 1)) {
        const flags = body[at] ?? 0;
        // Bit 0: compressed; bit 1: the end-of-stream message, which must say no error.
        expect(flags & 0x01).toBe(0);
        if (flags & 0x02) expect(body.subarray(at + 5, at + 5 + body.readUInt32BE(at + 1)).toString()).toBe("{}");
        else messages++;
      }
      expect(messages).toBeGreaterThan(0);
    } finally {
      await client.deleteSnapshot({ snapshotId: "lifeplainsnap" });
      await killSandbox("lifeplain");
    }
  });
});

/** A process that is gone, a zombie, exiting (PF_EXITING), or has SIGKILL pending. */
function killedOrGone(pid: string): boolean {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = /^State:\s+(\w)/m.exec(status)?.[1];
    const pending = ["SigPnd", "ShdPnd"].reduce(
      (mask, field) => mask | BigInt(`0x${new RegExp(`^${field}:\\s+(\\w+)`, "m").exec(status)?.[1] ?? "0"}`),
      0n,
    );
    // stat's fields after the command's closing parenthesis: state is the 3rd field, flags the 9th.
    const flags = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[6]);
    return state === "Z" || state === "X" || (pending & 0x100n) !== 0n || (flags & 0x4) !== 0;
  } catch {
    return true;
  }
}
