import type { CompiledEgress } from "../egress/policy.js";
import { egressRuleBodies, type GatewayPorts, REJECT_CHAIN, REJECT_CHAIN_RULES } from "../egress/rules.js";

export type { GatewayPorts } from "../egress/rules.js";

/**
 * The `iptables-restore` input (filter and nat tables) for a sandbox's own network namespace, enforcing its egress
 * policy. The namespace belongs to the host's user namespace, so sandbox root cannot change these rules.
 *
 * The filter OUTPUT chain lets loopback and replies through, then the policy's rules (../egress/rules.ts: the
 * gateway, Warren's floor, allowOut, denyOut and private ranges, the default). The nat OUTPUT chain leaves
 * loopback alone, then sends DNS (and, for policies with domains, TCP 80/443) to the node's egress gateway.
 */
export function sandboxFirewallRules(
  policy: CompiledEgress,
  hostAddr: string,
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
    "-A OUTPUT -o lo -j RETURN",
    ...bodies.nat.map((rule) => `-A OUTPUT ${rule}`),
    "COMMIT",
    "*filter",
    ":INPUT ACCEPT [0:0]",
    ":FORWARD DROP [0:0]",
    ":OUTPUT DROP [0:0]",
    `:${REJECT_CHAIN} - [0:0]`,
    ...REJECT_CHAIN_RULES,
    "-A OUTPUT -o lo -j ACCEPT",
    "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ...bodies.filter.map((rule) => `-A OUTPUT ${rule}`),
    "COMMIT",
    "",
  ].join("\n");
}
