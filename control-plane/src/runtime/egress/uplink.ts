import type { Logger } from "../../node-agent/log.js";
import { exec } from "../exec.js";

/**
 * Turns on IPv4 forwarding for the interface of the node's default route, so replies to sandbox egress come back
 * (each sandbox veth gets forwarding of its own). Only that interface, not `ip_forward` for all; and when the node
 * forwarded nothing arriving on its uplink before, a rule in `forwardChain` keeps it so for everything not going
 * to a sandbox interface (`sandboxIfaces`, an iptables interface pattern such as `wr-+`). Shared by the drivers.
 */
export async function enableUplinkForwarding(
  forwardChain: string,
  sandboxIfaces: string,
  commentTag: string,
  log: Logger,
): Promise<void> {
  const route = await exec("ip", ["-4", "route", "show", "default"], { allowFailure: true });
  const uplink = /\bdev (\S+)/.exec(route.stdout)?.[1];
  if (!uplink) {
    log.warn("no default route: sandboxes have no way out beyond this node's own links");
    return;
  }
  const key = `net.ipv4.conf.${uplink}.forwarding`;
  const current = await exec("sysctl", ["-n", key], { allowFailure: true });
  if (current.stdout.trim() === "1") return;
  const keep = ["-i", uplink, "!", "-o", sandboxIfaces, "-m", "comment", "--comment", commentTag];
  if ((await exec("iptables", ["-w", "-C", forwardChain, ...keep, "-j", "DROP"], { allowFailure: true })).code !== 0)
    await exec("iptables", ["-w", "-A", forwardChain, ...keep, "-j", "DROP"]);
  await exec("sysctl", ["-qw", `${key}=1`]);
  log.info("enabled IPv4 forwarding on the uplink for sandbox egress replies only", { uplink });
}
