import { type CompiledEgress, NEVER_REACHABLE, PRIVATE_RANGES } from "./policy.js";

/** The egress gateway's ports on the node (gateway.ts); absent when no gateway runs. */
export interface GatewayPorts {
  readonly dns: number;
  readonly http: number;
  readonly tls: number;
}

/** The chain every rejection jumps to (defined by `REJECT_CHAIN_RULES` in the same filter table). */
export const REJECT_CHAIN = "WARREN-REJECT";

/** Rejections are immediate (TCP reset, ICMP prohibited), so a denied connection fails at once instead of hanging. */
export const REJECT_CHAIN_RULES = [
  `-A ${REJECT_CHAIN} -p tcp -j REJECT --reject-with tcp-reset`,
  `-A ${REJECT_CHAIN} -j REJECT --reject-with icmp-admin-prohibited`,
] as const;

/** Rule bodies (what follows `-A <chain> [interface matches]`), in order; the caller picks chain and interfaces. */
export interface EgressRuleBodies {
  /** For the nat chain new sandbox connections pass first (OUTPUT in a sandbox's namespace, PREROUTING in front of a VM). */
  readonly nat: readonly string[];
  /** For the filter chain new sandbox connections pass (OUTPUT, or FORWARD from a VM's tap), after replies. */
  readonly filter: readonly string[];
}

/**
 * A sandbox's egress policy as iptables rules, shared by the runtime drivers; whoever applies them keeps them out
 * of the sandbox's reach (the namespace driver's sandbox namespace is owned by the host's user namespace; a VM's
 * namespace is outside the guest).
 *
 * Filter order (first match wins):
 * 1. the node's gateway (DNS; the domain gateway when the policy has domains) at `gatewayAddr`;
 * 2. Warren's floor: never link-local/metadata, loopback, multicast, reserved, or the node's sandbox network (the
 *    host and other sandboxes; the host's own rules drop those too);
 * 3. allowOut CIDRs (allow wins over deny, as in E2B);
 * 4. denyOut CIDRs, then private ranges (reachable only when allowed above);
 * 5. the default: accept, unless ALL_TRAFFIC is denied.
 *
 * Nat: DNS goes to the gateway's forwarder (whatever resolv.conf names), and, for policies with domains, TCP 80/443
 * to addresses not allowed by IP to the domain gateway (which checks Host/SNI).
 */
export function egressRuleBodies(
  policy: CompiledEgress,
  gatewayAddr: string,
  nodeCidr: string,
  gateway: GatewayPorts | undefined,
): EgressRuleBodies {
  const nat: string[] = [];
  const filter: string[] = [];
  const domains = gateway !== undefined && policy.domains.length > 0;
  if (gateway) {
    nat.push(`-p udp --dport 53 -j DNAT --to-destination ${gatewayAddr}:${gateway.dns}`);
    filter.push(`-d ${gatewayAddr}/32 -p udp --dport ${gateway.dns} -j ACCEPT`);
  }
  if (gateway && domains) {
    for (const cidr of policy.allowCidrs) nat.push(`-d ${cidr} -j RETURN`);
    nat.push(`-p tcp --dport 80 -j DNAT --to-destination ${gatewayAddr}:${gateway.http}`);
    nat.push(`-p tcp --dport 443 -j DNAT --to-destination ${gatewayAddr}:${gateway.tls}`);
    filter.push(`-d ${gatewayAddr}/32 -p tcp -m multiport --dports ${gateway.http},${gateway.tls} -j ACCEPT`);
  }
  for (const cidr of [...NEVER_REACHABLE, nodeCidr]) filter.push(`-d ${cidr} -j ${REJECT_CHAIN}`);
  for (const cidr of policy.allowCidrs) filter.push(`-d ${cidr} -j ACCEPT`);
  for (const cidr of policy.denyCidrs) if (!cidr.endsWith("/0")) filter.push(`-d ${cidr} -j ${REJECT_CHAIN}`);
  for (const cidr of PRIVATE_RANGES) filter.push(`-d ${cidr} -j ${REJECT_CHAIN}`);
  filter.push(policy.defaultAllow ? "-j ACCEPT" : `-j ${REJECT_CHAIN}`);
  return { nat, filter };
}
