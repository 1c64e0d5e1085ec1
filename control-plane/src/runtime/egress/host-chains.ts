import type { Logger } from "@warren/platform/log";
import { exec } from "../exec.js";

/** An agent's own chains on the host: jumped to from INPUT, FORWARD (filter) and POSTROUTING (nat). */
export interface HostChains {
  readonly input: string;
  readonly forward: string;
  readonly nat: string;
}

/**
 * Removes an agent's host chains and the jumps to them: what an agent that stops with no sandbox left does, so a
 * host that ran many agents (test runs, upgrades) does not walk one jump per agent that ever ran on every packet.
 * The host's uplink guard (`UPLINK_GUARD_CHAIN`) is not one of them. When the forward chain still holds the uplink
 * rule an earlier version kept there (tagged `legacyUplinkTag`: an agent told not to manage forwarding never moved
 * it to the shared guard), that rule is the uplink's guard: every chain is kept. Returns whether they were removed.
 */
export async function removeHostChains(chains: HostChains, legacyUplinkTag: string, log: Logger): Promise<boolean> {
  const forward = await exec("iptables", ["-w", "-S", chains.forward], { allowFailure: true });
  if (forward.stdout.includes(legacyUplinkTag)) {
    log.warn("keeping this agent's firewall chains: one still holds the uplink rule", { chain: chains.forward });
    return false;
  }
  for (const [table, chain, parent] of [
    ["filter", chains.input, "INPUT"],
    ["filter", chains.forward, "FORWARD"],
    ["nat", chains.nat, "POSTROUTING"],
  ] as const) {
    const iptables = (...args: string[]) => exec("iptables", ["-w", "-t", table, ...args], { allowFailure: true });
    // Every jump: two agent versions racing once could each have inserted one.
    for (let i = 0; i < 10 && (await iptables("-D", parent, "-j", chain)).code === 0; i++);
    await iptables("-F", chain);
    await iptables("-X", chain);
  }
  return true;
}
