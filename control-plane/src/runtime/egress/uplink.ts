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
 * Turns on IPv4 forwarding for the interface of the node's default route, so replies to sandbox egress come back
 * (each sandbox veth gets forwarding of its own). Only that interface, not `ip_forward` for all; and when the node
 * forwarded nothing arriving on its uplink before, rules in `forwardChain` (tagged `commentTag`) keep it so for
 * everything not going to a sandbox interface of any agent (`uplinkRules`). An agent that finds its own tagged
 * rules (it turned forwarding on earlier) rewrites them to the current form. Shared by the drivers.
 */
export async function enableUplinkForwarding(forwardChain: string, commentTag: string, log: Logger): Promise<void> {
  const route = await exec("ip", ["-4", "route", "show", "default"], { allowFailure: true });
  const uplink = /\bdev (\S+)/.exec(route.stdout)?.[1];
  if (!uplink) {
    log.warn("no default route: sandboxes have no way out beyond this node's own links");
    return;
  }
  const own = (await exec("iptables", ["-w", "-S", forwardChain], { allowFailure: true })).stdout
    .split("\n")
    .filter((line) => line.startsWith("-A ") && line.includes(commentTag));
  const key = `net.ipv4.conf.${uplink}.forwarding`;
  const current = await exec("sysctl", ["-n", key], { allowFailure: true });
  if (current.stdout.trim() === "1" && own.length === 0) return;
  const wanted = uplinkRules(forwardChain, uplink, commentTag).map((rule) => rule.join(" "));
  if (!sameRules(own, wanted)) {
    // One iptables-restore transaction (the chain's other rules untouched): the uplink is never open in between.
    const lines = ["*filter", ...own.map((line) => line.replace(/^-A /, "-D ")), ...wanted, "COMMIT", ""];
    const result = await exec("iptables-restore", ["-w", "--noflush"], { input: lines.join("\n"), allowFailure: true });
    if (result.code !== 0) throw new Error(`uplink forwarding rules failed: ${result.stderr.trim()}`);
  }
  if (current.stdout.trim() !== "1") {
    await exec("sysctl", ["-qw", `${key}=1`]);
    log.info("enabled IPv4 forwarding on the uplink for sandbox egress replies only", { uplink });
  }
}

/** Whether the rules `iptables -S` printed are `wanted`, in order (it prints comments quoted). */
function sameRules(printed: readonly string[], wanted: readonly string[]): boolean {
  return printed.length === wanted.length && printed.every((line, i) => line.replaceAll('"', "") === wanted[i]);
}
