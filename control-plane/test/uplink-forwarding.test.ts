import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SANDBOX_INTERFACES, UPLINK_GUARD_CHAIN, uplinkRules } from "../src/runtime/egress/uplink.js";

/**
 * The uplink rule when agents of both drivers share a host. A whole "node" is built from network namespaces this
 * test creates (no packet leaves them): `h` is the node, with an uplink `up0` to `o` (the outside, its default
 * route), a namespace-driver sandbox behind `wr-ut-1`, a microVM sandbox behind `wv-ut-1` and a LAN host behind
 * `lan0` (an interface the node forwarded from before). Two agents' forward chains are hooked in as on a real
 * node; the first agent to start turns uplink forwarding on behind the host's one guard chain.
 */
const P = "wupl";
const NS = { node: `${P}-h`, outside: `${P}-o`, nsSandbox: `${P}-s1`, vmSandbox: `${P}-s2`, lan: `${P}-l` };
const ADDR = {
  nodeUplink: "10.242.0.1",
  outside: "10.242.0.2",
  nsSandbox: "10.242.1.2",
  vmSandbox: "10.242.2.2",
  lan: "10.242.3.2",
};
const CHAINS = { namespaceAgent: "WARREN-UT1-FWD", microvmAgent: "WARREN-UT2-FWD" };
const GUARD = UPLINK_GUARD_CHAIN;
const CURRENT_GUARD = [
  `-A ${GUARD} -i up0 -o wr-+ -m comment --comment "warren:uplink" -j RETURN`,
  `-A ${GUARD} -i up0 -o wv-+ -m comment --comment "warren:uplink" -j RETURN`,
  `-A ${GUARD} -i up0 -m comment --comment "warren:uplink" -j DROP`,
];
const UPLINK_MODULE = fileURLToPath(new URL("../dist/runtime/egress/uplink.js", import.meta.url));
const HOST_CHAINS_MODULE = fileURLToPath(new URL("../dist/runtime/egress/host-chains.js", import.meta.url));
const servers: ChildProcess[] = [];

function sh(script: string): string {
  return execFileSync("sh", ["-c", script], { encoding: "utf8" });
}

function inNode(args: string[]): string {
  return execFileSync("ip", ["netns", "exec", NS.node, ...args], { encoding: "utf8" });
}

function teardown(): void {
  for (const ns of Object.values(NS)) sh(`ip netns del ${ns} 2>/dev/null || true`);
}

/** Links `h` to a new namespace: `hostIface` on the node with .1/30, `eth0` inside with .2/30 and a default route. */
function link(ns: string, hostIface: string, net: string): void {
  sh(`set -e
ip netns add ${ns}
ip link add ${hostIface} netns ${NS.node} type veth peer name eth0 netns ${ns}
ip -n ${NS.node} addr add ${net}.1/30 dev ${hostIface}
ip -n ${NS.node} link set ${hostIface} up
ip -n ${ns} addr add ${net}.2/30 dev eth0
ip -n ${ns} link set eth0 up
ip -n ${ns} link set lo up`);
  if (ns !== NS.outside) sh(`ip -n ${ns} route add default via ${net}.1`);
}

/** An HTTP server answering its name, in `ns`. */
async function serve(ns: string, addr: string, name: string): Promise<void> {
  const child = spawn(
    "ip",
    [
      "netns",
      "exec",
      ns,
      process.execPath,
      "-e",
      `require("node:http").createServer((q, s) => s.end(${JSON.stringify(name)})).listen(80, "${addr}", () => console.log("ready"))`,
    ],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  servers.push(child);
  await new Promise<void>((resolve, reject) => {
    child.stdout?.once("data", () => resolve());
    child.once("exit", (code) => reject(new Error(`server in ${ns} exited (${code})`)));
  });
}

/** What `from` gets for http://`to`/, or "unreachable" (2 s deadline: these are namespaces on one host). */
function fetchFrom(from: string, to: string): string {
  try {
    return execFileSync("ip", ["netns", "exec", from, "curl", "-sS", "--max-time", "2", `http://${to}/`], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    });
  } catch {
    return "unreachable";
  }
}

/** Runs the agents' code (the built module) inside the test's node namespace, as an agent starting there would. */
function startAgentUplink(chain: string, tag: string): void {
  const script = `const { enableUplinkForwarding } = await import(${JSON.stringify(UPLINK_MODULE)});
const log = { info() {}, warn() {}, error() {}, debug() {} };
await enableUplinkForwarding(${JSON.stringify(chain)}, ${JSON.stringify(tag)}, log);`;
  inNode([process.execPath, "--input-type=module", "-e", script]);
}

/** The host guard's rules (`-A` lines). */
function guardRules(): string[] {
  return inNode(["iptables", "-w", "-S", GUARD])
    .split("\n")
    .filter((line) => line.startsWith("-A "));
}

/** Takes the host's guard away (jump and chain), as on a node an older version set up. */
function removeGuard(): void {
  inNode(["iptables", "-w", "-D", "FORWARD", "-j", GUARD]);
  inNode(["iptables", "-w", "-F", GUARD]);
  inNode(["iptables", "-w", "-X", GUARD]);
}

/** Runs an agent's stop-time chain removal (the built module) inside the test's node namespace; its answer. */
function removeAgentChains(prefix: string, tag: string): boolean {
  const chains = { input: `${prefix}-IN`, forward: `${prefix}-FWD`, nat: `${prefix}-NAT` };
  const script = `const { removeHostChains } = await import(${JSON.stringify(HOST_CHAINS_MODULE)});
const log = { info() {}, warn() {}, error() {}, debug() {} };
console.log(await removeHostChains(${JSON.stringify(chains)}, ${JSON.stringify(tag)}, log));`;
  return inNode([process.execPath, "--input-type=module", "-e", script]).trim() === "true";
}

/** An agent's three chains with a rule each and their jumps, as a running agent has them. */
function makeAgentChains(prefix: string): void {
  for (const [table, suffix, parent] of [
    ["filter", "IN", "INPUT"],
    ["filter", "FWD", "FORWARD"],
    ["nat", "NAT", "POSTROUTING"],
  ]) {
    inNode(["iptables", "-w", "-t", table as string, "-N", `${prefix}-${suffix}`]);
    inNode(["iptables", "-w", "-t", table as string, "-A", `${prefix}-${suffix}`, "-i", "wr-zz-1", "-j", "RETURN"]);
    inNode(["iptables", "-w", "-t", table as string, "-I", parent as string, "-j", `${prefix}-${suffix}`]);
  }
}

beforeAll(async () => {
  teardown();
  sh(`ip netns add ${NS.node} && ip -n ${NS.node} link set lo up`);
  link(NS.outside, "up0", "10.242.0");
  link(NS.nsSandbox, "wr-ut-1", "10.242.1");
  link(NS.vmSandbox, "wv-ut-1", "10.242.2");
  link(NS.lan, "lan0", "10.242.3");
  // The node: default route out of its uplink; sandbox veths and the LAN link forward (as the agents and the
  // LAN's own set-up make them), the uplink does not yet; egress leaves masqueraded, as the agents do it.
  sh(`set -e
ip -n ${NS.node} route add default via ${ADDR.outside}
ip -n ${NS.outside} route add 10.242.3.0/30 via ${ADDR.nodeUplink}
for i in wr-ut-1 wv-ut-1 lan0; do ip netns exec ${NS.node} sysctl -qw net.ipv4.conf.$i.forwarding=1; done
ip netns exec ${NS.node} sysctl -qw net.ipv4.conf.up0.forwarding=0
ip netns exec ${NS.node} iptables -w -t nat -A POSTROUTING -o up0 -j MASQUERADE`);
  for (const chain of Object.values(CHAINS)) {
    inNode(["iptables", "-w", "-N", chain]);
    inNode(["iptables", "-w", "-I", "FORWARD", "1", "-j", chain]);
  }
  await serve(NS.outside, ADDR.outside, "outside");
  await serve(NS.lan, ADDR.lan, "lan");
}, 60_000);

afterAll(() => {
  for (const child of servers) child.kill("SIGKILL");
  teardown();
});

describe("uplink forwarding on a node shared by namespace and microVM agents", () => {
  it("the rules send uplink traffic on only towards sandbox interfaces of either driver", () => {
    expect(SANDBOX_INTERFACES).toEqual(["wr-+", "wv-+"]);
    expect(uplinkRules("C", "eth0", "t").map((rule) => rule.join(" "))).toEqual([
      "-A C -i eth0 -o wr-+ -m comment --comment t -j RETURN",
      "-A C -i eth0 -o wv-+ -m comment --comment t -j RETURN",
      "-A C -i eth0 -m comment --comment t -j DROP",
    ]);
  });

  it("the first agent turns forwarding on behind the host's guard: replies reach both drivers' sandboxes, the outside still not the LAN", () => {
    // Before: the uplink forwards nothing, so no reply comes back to either sandbox.
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("unreachable");
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("unreachable");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");

    // The namespace agent starts first: it turns forwarding on behind the host's one guard chain; the microVM
    // agent then finds the guard as it should be and changes nothing.
    startAgentUplink(CHAINS.namespaceAgent, "warren:ut1:uplink");
    const after = inNode(["iptables", "-w", "-S"]);
    startAgentUplink(CHAINS.microvmAgent, "warren:ut2:uplink");
    expect(inNode(["iptables", "-w", "-S"])).toBe(after);
    expect(inNode(["sysctl", "-n", "net.ipv4.conf.up0.forwarding"]).trim()).toBe("1");
    expect(guardRules()).toEqual(CURRENT_GUARD);
    // First in FORWARD, before any agent's chain; the agents' own chains hold nothing of it.
    expect(inNode(["iptables", "-w", "-S", "FORWARD"]).split("\n")[1]).toBe(`-A FORWARD -j ${GUARD}`);
    for (const chain of Object.values(CHAINS))
      expect(inNode(["iptables", "-w", "-S", chain]).trim()).toBe(`-N ${chain}`);

    // Replies come back to the namespace driver's sandbox and to the microVM's alike.
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("outside");
    // What the node did not forward from its uplink before, it still does not.
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
  });

  it("an agent moves the uplink rule an older version kept in its own chain to the host's guard, atomically", () => {
    // The old layout: no shared guard, and in the agent's own chain the old form of the rule — one DROP exempting
    // only the namespace driver's interfaces.
    removeGuard();
    const chain = CHAINS.namespaceAgent;
    inNode([
      "iptables",
      "-w",
      "-A",
      chain,
      "-i",
      "up0",
      "!",
      "-o",
      "wr-+",
      "-m",
      "comment",
      "--comment",
      "warren:ut1:uplink",
      "-j",
      "DROP",
    ]);
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("unreachable");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
    startAgentUplink(chain, "warren:ut1:uplink");
    expect(inNode(["iptables", "-w", "-S", chain]).trim()).toBe(`-N ${chain}`);
    expect(guardRules()).toEqual(CURRENT_GUARD);
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
    // And leaves current rules as they are.
    const before = inNode(["iptables", "-w", "-S"]);
    startAgentUplink(chain, "warren:ut1:uplink");
    expect(inNode(["iptables", "-w", "-S"])).toBe(before);
  });

  it("the guard outlives the agents' chains: with both removed (agents stopped), the outside still cannot reach the LAN", () => {
    for (const chain of Object.values(CHAINS)) {
      inNode(["iptables", "-w", "-D", "FORWARD", "-j", chain]);
      inNode(["iptables", "-w", "-X", chain]);
    }
    expect(inNode(["sysctl", "-n", "net.ipv4.conf.up0.forwarding"]).trim()).toBe("1");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("outside");
    // An agent starting later finds Warren's guard and keeps it.
    inNode(["iptables", "-w", "-N", CHAINS.namespaceAgent]);
    inNode(["iptables", "-w", "-I", "FORWARD", "2", "-j", CHAINS.namespaceAgent]);
    startAgentUplink(CHAINS.namespaceAgent, "warren:ut1:uplink");
    expect(guardRules()).toEqual(CURRENT_GUARD);
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
  });

  it("an agent's chains and jumps go at its stop, the host's guard stays; not while one holds the uplink's only guard", () => {
    makeAgentChains("WARREN-UT3");
    expect(removeAgentChains("WARREN-UT3", "warren:ut3:uplink")).toBe(true);
    const left = ["filter", "nat"].map((table) => inNode(["iptables", "-w", "-t", table, "-S"])).join("\n");
    expect(left).not.toContain("WARREN-UT3");
    expect(guardRules()).toEqual(CURRENT_GUARD);
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");

    // An older version's uplink rule still in the agent's own chain (an agent that does not manage forwarding never
    // moves it): it may be the uplink's only guard, so all of the agent's chains stay.
    makeAgentChains("WARREN-UT4");
    inNode([
      "iptables",
      "-w",
      "-A",
      "WARREN-UT4-FWD",
      ...["-i", "up0", "-m", "comment", "--comment", "warren:ut4:uplink", "-j", "DROP"],
    ]);
    expect(removeAgentChains("WARREN-UT4", "warren:ut4:uplink")).toBe(false);
    expect(inNode(["iptables", "-w", "-S", "FORWARD"])).toContain("-j WARREN-UT4-FWD");
    expect(inNode(["iptables", "-w", "-S", "WARREN-UT4-FWD"])).toContain("warren:ut4:uplink");
    expect(inNode(["iptables", "-w", "-t", "nat", "-S", "POSTROUTING"])).toContain("-j WARREN-UT4-NAT");
  });

  it("forwarding someone else turned on (no guard of Warren's anywhere) is left to them", () => {
    removeGuard();
    startAgentUplink(CHAINS.namespaceAgent, "warren:ut1:uplink");
    expect(() => inNode(["iptables", "-w", "-S", GUARD])).toThrow();
    expect(inNode(["iptables", "-w", "-S", CHAINS.namespaceAgent]).trim()).toBe(`-N ${CHAINS.namespaceAgent}`);
  });
});
