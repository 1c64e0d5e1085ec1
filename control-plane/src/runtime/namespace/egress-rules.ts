import { type CompiledEgress, NEVER_REACHABLE, PRIVATE_RANGES } from "../egress/policy.js";

/** The egress gateway's ports on the node (egress/gateway.ts); absent when no gateway runs. */
export interface GatewayPorts {
  readonly dns: number;
  readonly http: number;
  readonly tls: number;
}

/**
 * The `iptables-restore` input (filter and nat tables) for a sandbox's own network namespace, enforcing its egress
 * policy. The namespace belongs to the host's user namespace, so sandbox root cannot change these rules.
 *
 * Order of the filter OUTPUT chain (first match wins):
 * 1. loopback and replies;
 * 2. the node's gateway (DNS; the domain gateway when the policy has domains) at the host side of the veth;
 * 3. Warren's floor: never link-local/metadata, loopback, multicast, reserved, or the node's sandbox network (the
 *    host and other sandboxes; the host's own rules drop those too);
 * 4. allowOut CIDRs (allow wins over deny, as in E2B);
 * 5. denyOut CIDRs, then private ranges (reachable only when allowed above);
 * 6. the default: accept, unless ALL_TRAFFIC is denied.
 * Rejections are immediate (TCP reset, ICMP prohibited), so a denied connection fails at once instead of hanging.
 *
 * The nat OUTPUT chain sends DNS to the gateway's forwarder (whatever resolv.conf names), and, for policies with
 * domains, TCP 80/443 to addresses not allowed by IP to the domain gateway (which checks Host/SNI).
 */
export function sandboxFirewallRules(
  policy: CompiledEgress,
  hostAddr: string,
  nodeCidr: string,
  gateway: GatewayPorts | undefined,
): string {
  const nat = ["-A OUTPUT -o lo -j RETURN"];
  const filter = [
    "-A WARREN-REJECT -p tcp -j REJECT --reject-with tcp-reset",
    "-A WARREN-REJECT -j REJECT --reject-with icmp-admin-prohibited",
    "-A OUTPUT -o lo -j ACCEPT",
    "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
  ];
  const domains = gateway !== undefined && policy.domains.length > 0;
  if (gateway) {
    nat.push(`-A OUTPUT -p udp --dport 53 -j DNAT --to-destination ${hostAddr}:${gateway.dns}`);
    filter.push(`-A OUTPUT -d ${hostAddr}/32 -p udp --dport ${gateway.dns} -j ACCEPT`);
  }
  if (gateway && domains) {
    for (const cidr of policy.allowCidrs) nat.push(`-A OUTPUT -d ${cidr} -j RETURN`);
    nat.push(`-A OUTPUT -p tcp --dport 80 -j DNAT --to-destination ${hostAddr}:${gateway.http}`);
    nat.push(`-A OUTPUT -p tcp --dport 443 -j DNAT --to-destination ${hostAddr}:${gateway.tls}`);
    filter.push(`-A OUTPUT -d ${hostAddr}/32 -p tcp -m multiport --dports ${gateway.http},${gateway.tls} -j ACCEPT`);
  }
  for (const cidr of [...NEVER_REACHABLE, nodeCidr]) filter.push(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`);
  for (const cidr of policy.allowCidrs) filter.push(`-A OUTPUT -d ${cidr} -j ACCEPT`);
  for (const cidr of policy.denyCidrs) if (!cidr.endsWith("/0")) filter.push(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`);
  for (const cidr of PRIVATE_RANGES) filter.push(`-A OUTPUT -d ${cidr} -j WARREN-REJECT`);
  filter.push(policy.defaultAllow ? "-A OUTPUT -j ACCEPT" : "-A OUTPUT -j WARREN-REJECT");
  return [
    "*nat",
    ":PREROUTING ACCEPT [0:0]",
    ":INPUT ACCEPT [0:0]",
    ":OUTPUT ACCEPT [0:0]",
    ":POSTROUTING ACCEPT [0:0]",
    ...nat,
    "COMMIT",
    "*filter",
    ":INPUT ACCEPT [0:0]",
    ":FORWARD DROP [0:0]",
    ":OUTPUT DROP [0:0]",
    ":WARREN-REJECT - [0:0]",
    ...filter,
    "COMMIT",
    "",
  ].join("\n");
}
