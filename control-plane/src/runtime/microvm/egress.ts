import type { Logger } from "@warren/platform/log";
import { type EgressGateway, nodeEgressGateway } from "../egress/gateway.js";
import { CLOSED_EGRESS, type CompiledEgress, compileEgress, type EgressPolicy } from "../egress/policy.js";
import { egressRuleBodies, type GatewayPorts, REJECT_CHAIN, REJECT_CHAIN_RULES } from "../egress/rules.js";
import { GUEST_ADDR, GUEST_GATEWAY } from "./guest-image.js";
import type { VmNetwork, VmNetworkSlot } from "./network.js";

export interface VmEgressOptions {
  readonly netCidr: string;
  /** Upstream DNS server (`ip` or `ip:port`) of the egress gateway; default: the node's resolv.conf. */
  readonly dnsUpstream?: string;
  readonly log: Logger;
}

/**
 * Egress of this agent's microVM sandboxes: the node's egress gateway (../egress/gateway.ts, as the namespace
 * driver runs it: never connecting to the node's own addresses or any sandbox network) and each sandbox's
 * namespace rules (below), kept in step.
 */
export class VmEgress {
  private readonly gateway: EgressGateway;

  constructor(
    private readonly network: VmNetwork,
    options: VmEgressOptions,
  ) {
    this.gateway = nodeEgressGateway(options);
  }

  /** Starts the gateway and opens its (new) ports to the guests on the host. */
  async start(): Promise<void> {
    await this.network.start(await this.gateway.start());
  }

  /** The sandbox at `slot` gets `policy`: its namespace's firewall, then the gateway's view of it. */
  async apply(slot: VmNetworkSlot, policy: EgressPolicy | undefined): Promise<void> {
    const compiled = compileEgress(policy ?? CLOSED_EGRESS);
    await this.network.applyRules(slot, compiled);
    this.gateway.setPolicy(slot.sandboxAddr, compiled);
  }

  forget(slot: VmNetworkSlot): void {
    this.gateway.removePolicy(slot.sandboxAddr);
  }

  /**
   * Nothing listens on the gateway's ports once it is closed (and another process could): the host stops
   * accepting them from guests until the next agent start opens the new ones.
   */
  async close(): Promise<void> {
    await this.network.start();
    await this.gateway.close();
  }
}

/**
 * The `iptables-restore` input for a microVM sandbox's network namespace (network.ts): the address translation
 * that makes the guest reachable, and the guest's egress policy. The namespace is the agent's; the guest, behind
 * its tap, cannot touch it.
 *
 * Inbound (node → guest): DNAT of everything arriving on eth0 for the sandbox address to the guest's fixed
 * address, SNAT to the tap's address (the guest needs no route beyond its /30 for it).
 *
 * Outbound (guest → anything): the guest's default route is the tap. What it sends is forwarded only when it
 * carries the guest's own address and the policy's rules (../egress/rules.ts, the namespace driver's rules: the
 * node's gateway, Warren's floor, allowOut, denyOut and private ranges, the default) accept it; nat PREROUTING
 * sends DNS, and for domain policies TCP 80/443, to the node's egress gateway. It leaves eth0 with the sandbox's
 * address, so the gateway and the node's rules tell sandboxes apart as they do for namespace sandboxes.
 *
 * Nothing of the namespace itself answers the guest (INPUT from the tap: replies only).
 */
export function vmNamespaceRules(
  sandboxAddr: string,
  hostAddr: string,
  policy: CompiledEgress,
  nodeCidr: string,
  gateway: GatewayPorts | undefined,
): string {
  const bodies = egressRuleBodies(policy, hostAddr, nodeCidr, gateway);
  return [
    "*nat",
    ":PREROUTING ACCEPT [0:0]",
    ":INPUT ACCEPT [0:0]",
    ":OUTPUT ACCEPT [0:0]",
    ":POSTROUTING ACCEPT [0:0]",
    `-A PREROUTING -i eth0 -d ${sandboxAddr} -j DNAT --to-destination ${GUEST_ADDR}`,
    ...bodies.nat.map((rule) => `-A PREROUTING -i tap0 -s ${GUEST_ADDR} ${rule}`),
    `-A POSTROUTING -o tap0 -j SNAT --to-source ${GUEST_GATEWAY}`,
    `-A POSTROUTING -o eth0 -s ${GUEST_ADDR} -j SNAT --to-source ${sandboxAddr}`,
    "COMMIT",
    "*filter",
    ":INPUT ACCEPT [0:0]",
    ":FORWARD DROP [0:0]",
    ":OUTPUT ACCEPT [0:0]",
    `:${REJECT_CHAIN} - [0:0]`,
    ...REJECT_CHAIN_RULES,
    "-A INPUT -i tap0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    "-A INPUT -i tap0 -j DROP",
    `-A FORWARD -i eth0 -o tap0 -d ${GUEST_ADDR} -j ACCEPT`,
    "-A FORWARD -i tap0 -o eth0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ...bodies.filter.map((rule) => `-A FORWARD -i tap0 -o eth0 -s ${GUEST_ADDR} ${rule}`),
    "COMMIT",
    "",
  ].join("\n");
}
