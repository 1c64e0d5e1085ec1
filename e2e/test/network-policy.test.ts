import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ClusterEnv, LocalCluster } from "@warren/local";
import { ALL_TRAFFIC, Sandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OutsideWorld, WORLD } from "../src/outside-world.js";

// Sandbox egress policy through the whole cluster (api → master → node agent → the sandbox's own firewall and the
// node's egress gateway), driven by the official e2b SDK. The "internet" is a network namespace this test makes
// (src/outside-world.ts): no packet leaves the machine. What must never be reached (link-local metadata, the node,
// other sandboxes, private ranges) is proven by the rules and routes in place, not by sending traffic there.
const dataDir = mkdtempSync(join(tmpdir(), "warren-netpol-"));
const world = new OutsideWorld();
let cluster: LocalCluster;
let env: ClusterEnv;

beforeAll(async () => {
  await world.start();
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: "n",
    nodeCidr: () => "10.217.0.0/22",
    env: { WARREN_DNS_UPSTREAM: world.dnsUpstream },
  });
  env = await cluster.start();
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}, 600_000);

afterAll(async () => {
  await cluster?.stop();
  await world.stop();
  if (!process.env.WARREN_E2E_KEEP) rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

/** `curl` from inside the sandbox: the body, or `curl-exit-<code>` when the connection failed. */
async function curl(sbx: Sandbox, args: string): Promise<string> {
  const result = await sbx.commands.run(`curl -sS --max-time 5 ${args} 2>/dev/null || echo "curl-exit-$?"`);
  return result.stdout.trim();
}

async function resolves(sbx: Sandbox, name: string): Promise<string> {
  const result = await sbx.commands.run(`getent ahostsv4 ${name} | head -1 | cut -d' ' -f1 || true`);
  return result.stdout.trim();
}

const A = `http://${WORLD.serverA}/`;
const B = `http://${WORLD.serverB}/`;

/** The sandbox's network namespace on the node (found by the host side address its resolv.conf names). */
async function sandboxNetns(sbx: Sandbox): Promise<string> {
  const hostAddr = (await sbx.commands.run("awk '/^nameserver/{print $2}' /etc/resolv.conf")).stdout.trim();
  const line = execFileSync("ip", ["-o", "-4", "addr", "show"], { encoding: "utf8" })
    .split("\n")
    .find((l) => l.includes(` ${hostAddr}/30 `));
  const veth = line?.split(/\s+/)[1]?.split("@")[0];
  if (!veth?.startsWith("wr-na-")) throw new Error(`no sandbox veth for ${hostAddr}`);
  return `/run/netns/warren-na-${veth.slice("wr-na-".length)}`;
}

describe("egress policy", () => {
  it("default policy (E2B's: internet on): both servers and DNS answer; getInfo has no policy", async () => {
    const sbx = await Sandbox.create("base");
    try {
      expect(await curl(sbx, A)).toMatch(/^server-a /);
      expect(await curl(sbx, B)).toMatch(/^server-b /);
      expect(await resolves(sbx, "b.test.warren")).toBe(WORLD.serverB);
      expect(await curl(sbx, "http://a.test.warren:8080/")).toMatch(/^server-a:8080 a.test.warren:8080 from /);
      // Egress leaves with the node's address on the world's link, not the sandbox's own.
      expect(await curl(sbx, A)).toContain("from 198.18.0.1");
      const info = await sbx.getInfo();
      expect(info.network).toBeUndefined();
    } finally {
      await sbx.kill();
    }
  });

  it("allowInternetAccess: false blocks everything at once, DNS included", async () => {
    const sbx = await Sandbox.create("base", { allowInternetAccess: false });
    try {
      // Refused at once (TCP reset: curl's "couldn't connect", 7), not dropped into a timeout (28).
      expect(await curl(sbx, A)).toBe("curl-exit-7");
      expect(await curl(sbx, B)).toMatch(/^curl-exit-/);
      expect(await resolves(sbx, "a.test.warren")).toBe("");
      expect((await sbx.getInfo()).allowInternetAccess).toBe(false);
    } finally {
      await sbx.kill();
    }
  });

  it("allowOut one IP with ALL_TRAFFIC denied permits only that IP, on any port", async () => {
    const sbx = await Sandbox.create("base", {
      network: { allowOut: [WORLD.serverA], denyOut: [ALL_TRAFFIC] },
    });
    try {
      expect(await curl(sbx, A)).toMatch(/^server-a /);
      expect(await curl(sbx, `http://${WORLD.serverA}:8080/`)).toMatch(/^server-a:8080 /);
      expect(await curl(sbx, B)).toMatch(/^curl-exit-/);
      const info = await sbx.getInfo();
      expect(info.network?.allowOut).toEqual([WORLD.serverA]);
      expect(info.network?.denyOut).toEqual([ALL_TRAFFIC]);
    } finally {
      await sbx.kill();
    }
  });

  it("denyOut one IP with the default open blocks only that IP; allowOut wins over denyOut", async () => {
    const sbx = await Sandbox.create("base", {
      network: { denyOut: [WORLD.serverB, "198.18.1.0/24"], allowOut: [WORLD.serverA] },
    });
    try {
      expect(await curl(sbx, B)).toMatch(/^curl-exit-/);
      expect(await curl(sbx, A)).toMatch(/^server-a /);
    } finally {
      await sbx.kill();
    }
  });

  it("a domain allow permits by name (HTTP Host, TLS SNI) and nothing by raw address", async () => {
    const sbx = await Sandbox.create("base", {
      network: { allowOut: ["a.test.warren"], denyOut: [ALL_TRAFFIC] },
    });
    try {
      expect(await resolves(sbx, "a.test.warren")).toBe(WORLD.serverA);
      expect(await resolves(sbx, "b.test.warren")).toBe(""); // not permitted: the forwarder refuses it
      expect(await curl(sbx, "http://a.test.warren/")).toMatch(/^server-a a.test.warren from /);
      expect(await curl(sbx, "-k https://a.test.warren/")).toMatch(/^server-a:tls a.test.warren from /);
      // The same server by raw address: HTTP answered 403 by the gateway, TLS without a permitted SNI reset.
      expect(await curl(sbx, `-o /dev/null -w '%{http_code}' ${A}`)).toBe("403");
      expect(await curl(sbx, `-k https://${WORLD.serverA}/`)).toMatch(/^curl-exit-/);
      // Other ports go nowhere (only 80/443 carry names the gateway can check).
      expect(await curl(sbx, "http://a.test.warren:8080/")).toMatch(/^curl-exit-/);
      // Naming a permitted host while dialling another address reaches the permitted host, never the other one.
      expect(await curl(sbx, `-H 'Host: a.test.warren' ${B}`)).toMatch(/^server-a a.test.warren /);
      expect(await curl(sbx, `-k --resolve a.test.warren:443:${WORLD.serverB} https://a.test.warren/`)).toMatch(
        /^server-a:tls /,
      );
      expect(await curl(sbx, `-o /dev/null -w '%{http_code}' -H 'Host: b.test.warren' ${A}`)).toBe("403");
    } finally {
      await sbx.kill();
    }
  });

  it("wildcard domains match subdomains only; a name resolving to metadata is refused by the gateway", async () => {
    const sbx = await Sandbox.create("base", {
      network: { allowOut: ["*.a.test.warren", "meta.test.warren"], denyOut: [ALL_TRAFFIC] },
    });
    try {
      expect(await curl(sbx, "http://api.a.test.warren/")).toMatch(/^server-a api.a.test.warren /);
      expect(await curl(sbx, `-o /dev/null -w '%{http_code}' -H 'Host: a.test.warren' ${A}`)).toBe("403");
      // meta.test.warren resolves to 169.254.169.254: the gateway refuses before connecting anywhere.
      expect(await curl(sbx, "http://meta.test.warren/")).toContain(
        "resolves only to addresses a sandbox may not reach",
      );
    } finally {
      await sbx.kill();
    }
  });

  it("updateNetwork replaces the policy of a running sandbox at once, and clearing it restores the default", async () => {
    const sbx = await Sandbox.create("base", { allowInternetAccess: false });
    try {
      const pid = (await sbx.commands.run("sleep 600", { background: true })).pid;
      expect(await curl(sbx, A)).toMatch(/^curl-exit-/);
      await sbx.updateNetwork({ allowOut: [WORLD.serverB], denyOut: [ALL_TRAFFIC] });
      expect(await curl(sbx, B)).toMatch(/^server-b /);
      expect(await curl(sbx, A)).toMatch(/^curl-exit-/);
      expect((await sbx.getInfo()).network?.allowOut).toEqual([WORLD.serverB]);
      await sbx.updateNetwork({});
      expect(await curl(sbx, A)).toMatch(/^server-a /);
      expect(await curl(sbx, B)).toMatch(/^server-b /);
      // The same sandbox throughout: its processes were never restarted.
      expect((await sbx.commands.list()).map((p) => p.pid)).toContain(pid);
      await expect(sbx.updateNetwork({ allowOut: ["a.test.warren"] })).rejects.toThrow(/ALL_TRAFFIC/);
      await expect(Sandbox.updateNetwork("nosuchsandbox1", {})).rejects.toThrow(/not found/);
    } finally {
      await sbx.kill();
    }
  });

  it("the floor holds whatever the policy: metadata, private ranges, the node and other sandboxes are blocked by rules", async () => {
    const sbx = await Sandbox.create("base", { network: { allowOut: ["0.0.0.0/0"] } });
    try {
      const netns = await sandboxNetns(sbx);
      const rules = execFileSync("nsenter", [`--net=${netns}`, "iptables", "-S", "OUTPUT"], { encoding: "utf8" });
      const lines = rules.split("\n");
      const at = (rule: string) => lines.indexOf(rule);
      // The floor comes before any allow entry, so even allowOut 0.0.0.0/0 cannot open it.
      for (const cidr of ["169.254.0.0/16", "127.0.0.0/8", "224.0.0.0/4", "10.217.0.0/22"]) {
        expect(at(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`)).toBeGreaterThan(-1);
        expect(at(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`)).toBeLessThan(at("-A OUTPUT -j ACCEPT"));
      }
      expect(at("-A OUTPUT -d 10.0.0.0/8 -j WARREN-REJECT")).toBeGreaterThan(-1);
      // The host side drops link-local and sandbox-to-sandbox forwarding, and everything to the node itself but
      // the gateway's ports.
      const host = execFileSync("iptables", ["-S", "WARREN-NA-FWD"], { encoding: "utf8" });
      expect(host).toMatch(/-d 169\.254\.0\.0\/16 .*-j DROP/);
      expect(host).toMatch(/-o wr-\+ .*-j DROP/);
      const input = execFileSync("iptables", ["-S", "WARREN-NA-IN"], { encoding: "utf8" });
      expect(input).toMatch(/-i wr-na-\+ -p udp .*--dport \d+ .*-j ACCEPT/);
      const veth = `wr-na-${netns.split("-").pop()}`;
      expect(input).toContain(
        `-A WARREN-NA-IN -i ${veth} -m comment --comment "warren:na:${netns.split("-").pop()}" -j DROP`,
      );
      // The sandbox's only routes: its /30 and the default via the node.
      const routes = execFileSync("ip", ["-n", netns.split("/").pop() as string, "route"], { encoding: "utf8" });
      expect(routes.trim().split("\n")).toHaveLength(2);
      expect(routes).toMatch(/^default via 10\.217\.\d+\.\d+ dev eth0/m);
    } finally {
      await sbx.kill();
    }
  });

  it("allowPublicTraffic: false makes the proxy ask for the traffic token on sandbox ports", async () => {
    const sbx = await Sandbox.create("base", { network: { allowPublicTraffic: false } });
    try {
      await sbx.commands.run(`python3 -m http.server 8000 --bind 0.0.0.0`, { background: true });
      const url = `${env.E2B_SANDBOX_URL}/`;
      const headers = { "E2b-Sandbox-Id": sbx.sandboxId, "E2b-Sandbox-Port": "8000" };
      const deadline = Date.now() + 15_000;
      let withToken = 0;
      while (Date.now() < deadline) {
        withToken = (
          await fetch(url, { headers: { ...headers, "e2b-traffic-access-token": sbx.trafficAccessToken ?? "" } })
        ).status;
        if (withToken === 200) break;
        await new Promise((r) => setTimeout(r, 200));
      }
      expect(sbx.trafficAccessToken).toBeTruthy();
      expect(withToken).toBe(200);
      expect((await fetch(url, { headers })).status).toBe(403);
      expect((await fetch(url, { headers: { ...headers, "e2b-traffic-access-token": "wrong" } })).status).toBe(403);
    } finally {
      await sbx.kill();
    }
  });

  it("a team whose egress is forbidden gets 403 when asking for egress, and closed sandboxes otherwise", async () => {
    const admin = { "X-Admin-Token": env.WARREN_ADMIN_TOKEN, "Content-Type": "application/json" };
    const created = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams`, {
      method: "POST",
      headers: admin,
      body: JSON.stringify({ name: "no-egress", egressMode: "forbidden" }),
    });
    expect(created.status).toBe(201);
    const { team, apiKey } = (await created.json()) as { team: { egressMode: string }; apiKey: { key: string } };
    expect(team.egressMode).toBe("forbidden");
    await expect(Sandbox.create("base", { apiKey: apiKey.key, allowInternetAccess: true })).rejects.toThrow(
      /forbids network egress/,
    );
    await expect(
      Sandbox.create("base", { apiKey: apiKey.key, network: { allowOut: [WORLD.serverA], denyOut: [ALL_TRAFFIC] } }),
    ).rejects.toThrow(/forbids network egress/);
    const sbx = await Sandbox.create("base", { apiKey: apiKey.key });
    try {
      expect(await curl(sbx, A)).toMatch(/^curl-exit-/);
      const detail = await fetch(`${env.WARREN_API_URL}/sandboxes/${sbx.sandboxId}`, {
        headers: { "X-API-KEY": apiKey.key },
      });
      expect(((await detail.json()) as { egress: unknown }).egress).toEqual({ allowOut: [], denyOut: [ALL_TRAFFIC] });
      await expect(sbx.updateNetwork({ allowOut: [WORLD.serverA], denyOut: [ALL_TRAFFIC] })).rejects.toThrow(
        /forbids network egress/,
      );
      const bad = await fetch(`${env.WARREN_API_URL}/warren/v1/admin/teams/nosuchteam`, {
        method: "PATCH",
        headers: admin,
        body: JSON.stringify({ egressMode: "sometimes" }),
      });
      expect(bad.status).toBe(400);
    } finally {
      await sbx.kill();
    }
  });

  it("after a node agent restart, every sandbox's policy is enforced again (gateway on new ports)", async () => {
    const sbx = await Sandbox.create("base", {
      network: { allowOut: ["a.test.warren", WORLD.serverB], denyOut: [ALL_TRAFFIC] },
    });
    try {
      expect(await curl(sbx, "http://a.test.warren/")).toMatch(/^server-a /);
      await cluster.killNodeAgent(0);
      cluster.startNodeAgent(0);
      const deadline = Date.now() + 60_000;
      let body = "";
      while (Date.now() < deadline) {
        body = await curl(sbx, "http://a.test.warren/").catch(() => "");
        if (body.startsWith("server-a ")) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      expect(body).toMatch(/^server-a a.test.warren /);
      expect(await curl(sbx, B)).toMatch(/^server-b /);
      expect(await curl(sbx, `-o /dev/null -w '%{http_code}' ${A}`)).toBe("403");
      // Wait until the restarted agent serves creates again, so the cluster stops a settled agent.
      const until = Date.now() + 60_000;
      for (;;) {
        const probe = await Sandbox.create("base").catch((error: unknown) => {
          if (Date.now() > until) throw error;
          return undefined;
        });
        if (probe) {
          await probe.kill();
          break;
        }
        await new Promise((r) => setTimeout(r, 500));
      }
    } finally {
      await sbx.kill();
    }
  });
});

// Not egress, but this cluster is a real one: the logs API serves a sandbox's lifecycle events and envd's own lines.
describe("sandbox logs", () => {
  it("merges lifecycle events with envd's lines from the node, filtered by level, search and cursor", async () => {
    const sbx = await Sandbox.create("base");
    try {
      await sbx.commands.run("echo logged-command");
      const get = async (query: string) => {
        const res = await fetch(`${env.E2B_API_URL}/v2/sandboxes/${sbx.sandboxId}/logs${query}`, {
          headers: { "X-API-KEY": env.E2B_API_KEY },
        });
        expect(res.status).toBe(200);
        return (
          (await res.json()) as {
            logs: { timestamp: string; level: string; message: string; fields: Record<string, string> }[];
          }
        ).logs;
      };
      // A sandbox's log still grows a little after its first command (lines and events written on their own
      // schedule): the newest-entry and cursor checks below need a log that has stopped growing.
      let all = await get("");
      for (const deadline = Date.now() + 10_000; Date.now() < deadline; ) {
        await new Promise((resolve) => setTimeout(resolve, 500));
        const again = await get("");
        if (again.length === all.length) break;
        all = again;
      }
      expect(all.some((e) => e.fields.source === "lifecycle" && e.fields.type === "sandbox.started")).toBe(true);
      const started = all.find((e) => e.fields.source === "envd" && e.message === "process started");
      expect(started).toBeDefined();
      const times = all.map((e) => Date.parse(e.timestamp));
      expect(times).toEqual([...times].sort((a, b) => a - b));
      expect((await get("?level=warn")).every((e) => e.level === "warn" || e.level === "error")).toBe(true);
      const searched = await get("?search=process%20started");
      expect(searched.length).toBeGreaterThan(0);
      expect(searched.every((e) => e.message.includes("process started"))).toBe(true);
      const newest = await get("?direction=backward&limit=1");
      expect(newest).toHaveLength(1);
      expect(Date.parse(newest[0]?.timestamp ?? "")).toBe(Math.max(...times));
      const later = await get(`?cursor=${Math.max(...times) + 1}`);
      expect(later).toEqual([]);
      const bad = await fetch(`${env.E2B_API_URL}/v2/sandboxes/${sbx.sandboxId}/logs?level=loud`, {
        headers: { "X-API-KEY": env.E2B_API_KEY },
      });
      expect(bad.status).toBe(400);
    } finally {
      await sbx.kill();
    }
  });
});
