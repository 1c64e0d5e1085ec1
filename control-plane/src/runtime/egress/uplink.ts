import type { Logger } from "@warren/platform/log";
import { exec } from "../exec.js";

/**
 * The host-side interfaces of every agent's sandboxes, whatever their driver (iptables patterns): `wr-<tag>-<n>`
 * veths of the namespace driver, `wv-<tag>-<n>` of the microvm driver. Rules that keep sandboxes apart, or let
 * replies through to them, name all of them: agents of both drivers may share a host.
 */
export const SANDBOX_INTERFACES = ["wr-+", "wv-+"] as const;

/**
 * The rules `enableUplinkForwarding` keeps in `forwardChain` (iptables `-A` arguments): what arrives on the uplink
 * goes on only towards a sandbox interface (replies to sandbox egress, either driver's: each sandbox veth accepts
 * only replies further on); everything else arriving there is dropped, as before forwarding was turned on.
 */
export function uplinkRules(forwardChain: string, uplink: string, commentTag: string): string[][] {
  const tagged = ["-m", "comment", "--comment", commentTag];
  return [
    ...SANDBOX_INTERFACES.map((iface) => ["-A", forwardChain, "-i", uplink, "-o", iface, ...tagged, "-j", "RETURN"]),
    ["-A", forwardChain, "-i", uplink, ...tagged, "-j", "DROP"],
  ];
}

/**
 * The host's one chain (jumped to first from FORWARD) that keeps its uplink from forwarding anything but replies to
 * sandboxes once Warren turned forwarding on there. Shared by every agent of either driver and never removed by
 * one: forwarding stays on when agents stop, so the guard must too, while each agent's own chains can go with it.
 */
export const UPLINK_GUARD_CHAIN = "WARREN-UPLINK";
const UPLINK_GUARD_TAG = "warren:uplink";

/**
 * Turns on IPv4 forwarding for the interface of the node's default route, so replies to sandbox egress come back
 * (each sandbox veth gets forwarding of its own). Only that interface, not `ip_forward` for all; and when the node
 * forwarded nothing arriving on its uplink before, the host's guard chain (`UPLINK_GUARD_CHAIN`, `uplinkRules`)
 * keeps it so for everything not going to a sandbox interface of any agent. Forwarding found on is Warren's to
 * guard only when a guard of Warren's exists: the shared chain, or the rules an earlier version kept in an agent's
 * own `forwardChain` (tagged `legacyTag`), which move to the shared chain in the same transaction. Shared by the
 * drivers.
 */
export async function enableUplinkForwarding(forwardChain: string, legacyTag: string, log: Logger): Promise<void> {
  const route = await exec("ip", ["-4", "route", "show", "default"], { allowFailure: true });
  const uplink = /\bdev (\S+)/.exec(route.stdout)?.[1];
  if (!uplink) {
    log.warn("no default route: sandboxes have no way out beyond this node's own links");
    return;
  }
  const rulesOf = async (chain: string) => {
    const listed = await exec("iptables", ["-w", "-S", chain], { allowFailure: true });
    return listed.code === 0 ? listed.stdout.split("\n").filter((line) => line.startsWith("-A ")) : undefined;
  };
  const legacy = ((await rulesOf(forwardChain)) ?? []).filter((line) => line.includes(legacyTag));
  const guard = await rulesOf(UPLINK_GUARD_CHAIN);
  const key = `net.ipv4.conf.${uplink}.forwarding`;
  const current = (await exec("sysctl", ["-n", key], { allowFailure: true })).stdout.trim();
  // Forwarding someone else turned on is theirs to guard.
  if (current === "1" && guard === undefined && legacy.length === 0) return;
  const wanted = uplinkRules(UPLINK_GUARD_CHAIN, uplink, UPLINK_GUARD_TAG).map((rule) => rule.join(" "));
  const jumped =
    guard !== undefined &&
    (await exec("iptables", ["-w", "-C", "FORWARD", "-j", UPLINK_GUARD_CHAIN], { allowFailure: true })).code === 0;
  if (!jumped || legacy.length > 0 || !sameRules(guard ?? [], wanted)) {
    // One iptables-restore transaction: declaring the chain flushes it, the jump, the old rules' removal — the
    // uplink is never open in between.
    const lines = [
      "*filter",
      `:${UPLINK_GUARD_CHAIN} - [0:0]`,
      ...wanted,
      ...(jumped ? [] : [`-I FORWARD 1 -j ${UPLINK_GUARD_CHAIN}`]),
      ...legacy.map((line) => line.replace(/^-A /, "-D ")),
      "COMMIT",
      "",
    ];
    const result = await exec("iptables-restore", ["-w", "--noflush"], { input: lines.join("\n"), allowFailure: true });
    if (result.code !== 0) throw new Error(`uplink forwarding rules failed: ${result.stderr.trim()}`);
  }
  if (current !== "1") {
    await exec("sysctl", ["-qw", `${key}=1`]);
    log.info("enabled IPv4 forwarding on the uplink for sandbox egress replies only", { uplink });
  }
}

/** Whether the rules `iptables -S` printed are `wanted`, in order (it prints comments quoted). */
function sameRules(printed: readonly string[], wanted: readonly string[]): boolean {
  return printed.length === wanted.length && printed.every((line, i) => line.replaceAll('"', "") === wanted[i]);
}
