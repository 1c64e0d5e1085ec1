import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SANDBOX_INTERFACES, uplinkRules } from "../src/runtime/egress/uplink.js";

/**
 * The uplink rule when agents of both drivers share a host. A whole "node" is built from network namespaces this
 * test creates (no packet leaves them): `h` is the node, with an uplink `up0` to `o` (the outside, its default
 * route), a namespace-driver sandbox behind `wr-ut-1`, a microVM sandbox behind `wv-ut-1` and a LAN host behind
 * `lan0` (an interface the node forwarded from before). Two agents' forward chains are hooked in as on a real
 * node; the first agent to start turns uplink forwarding on, with its rules in its own chain.
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
const UPLINK_MODULE = fileURLToPath(new URL("../dist/runtime/egress/uplink.js", import.meta.url));
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

  it("with the first agent's rules, replies reach both drivers' sandboxes and the outside still cannot reach the LAN", () => {
    // Before: the uplink forwards nothing, so no reply comes back to either sandbox.
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("unreachable");
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("unreachable");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");

    // The namespace agent starts first: it turns forwarding on with its rules; the microVM agent then finds
    // forwarding on and adds none (the node's state is the first agent's).
    startAgentUplink(CHAINS.namespaceAgent, "warren:ut1:uplink");
    startAgentUplink(CHAINS.microvmAgent, "warren:ut2:uplink");
    expect(inNode(["sysctl", "-n", "net.ipv4.conf.up0.forwarding"]).trim()).toBe("1");
    expect(inNode(["iptables", "-w", "-S", CHAINS.microvmAgent]).trim()).toBe(`-N ${CHAINS.microvmAgent}`);
    expect(inNode(["iptables", "-w", "-S", CHAINS.namespaceAgent]).trim().split("\n")).toEqual([
      `-N ${CHAINS.namespaceAgent}`,
      `-A ${CHAINS.namespaceAgent} -i up0 -o wr-+ -m comment --comment "warren:ut1:uplink" -j RETURN`,
      `-A ${CHAINS.namespaceAgent} -i up0 -o wv-+ -m comment --comment "warren:ut1:uplink" -j RETURN`,
      `-A ${CHAINS.namespaceAgent} -i up0 -m comment --comment "warren:ut1:uplink" -j DROP`,
    ]);

    // Replies come back to the namespace driver's sandbox and to the microVM's alike (the microVM's were dropped
    // when the first agent's rule exempted only its own driver's interfaces).
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("outside");
    // What the node did not forward from its uplink before, it still does not.
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
  });

  it("an agent rewrites the rules an older version of it left (atomically, in order) when it starts again", () => {
    // The old form: one DROP exempting only the namespace driver's interfaces.
    const chain = CHAINS.namespaceAgent;
    inNode(["iptables", "-w", "-F", chain]);
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
    startAgentUplink(chain, "warren:ut1:uplink");
    expect(inNode(["iptables", "-w", "-S", chain]).trim().split("\n")).toHaveLength(4);
    expect(fetchFrom(NS.vmSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.nsSandbox, ADDR.outside)).toBe("outside");
    expect(fetchFrom(NS.outside, ADDR.lan)).toBe("unreachable");
    // And leaves current rules as they are.
    const before = inNode(["iptables", "-w", "-S", chain]);
    startAgentUplink(chain, "warren:ut1:uplink");
    expect(inNode(["iptables", "-w", "-S", chain])).toBe(before);
  });
});
