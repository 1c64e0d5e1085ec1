import type { Logger } from "@warren/platform/log";
import { type EgressGateway, nodeEgressGateway } from "../egress/gateway.js";
import { CLOSED_EGRESS, compileEgress, OPEN_EGRESS } from "../egress/policy.js";
import { type GatewayPorts, sandboxFirewallRules } from "./egress-rules.js";
import type { InstanceRecord } from "./instance-records.js";
import type { NetworkPool } from "./network.js";

export interface SandboxEgressOptions {
  readonly netCidr: string;
  /** Upstream DNS server (`ip` or `ip:port`) of the egress gateway; default: the node's resolv.conf. */
  readonly dnsUpstream?: string;
  readonly log: Logger;
}

/**
 * Egress of this agent's namespace sandboxes: the node's egress gateway (../egress/gateway.ts) and each
 * sandbox's firewall in its network namespace (egress-rules.ts), kept in step. The gateway listens on new ports
 * at every start, so the host rules that let sandboxes reach it and every sandbox's rules follow them.
 */
export class SandboxEgress {
  private readonly gateway: EgressGateway;
  private gatewayPorts: GatewayPorts | undefined;

  constructor(
    private readonly network: NetworkPool,
    options: SandboxEgressOptions,
  ) {
    this.gateway = nodeEgressGateway(options);
  }

  /**
   * Starts the gateway and opens its (new) ports to the sandboxes on the host; slots made from now on come with
   * E2B's default policy (internet on: what the master asks for unless a create or its team says otherwise).
   */
  async start(): Promise<void> {
    const ports = await this.gateway.start();
    this.gatewayPorts = ports;
    await this.network.allowGateway(ports);
    const open = compileEgress(OPEN_EGRESS);
    this.network.prepareRules((slot) => sandboxFirewallRules(open, slot.hostAddr, this.network.cidr, ports));
  }

  /** The instance's policy (`record.egress`): its namespace's firewall, then the gateway's view of it. */
  async apply(record: InstanceRecord): Promise<void> {
    const policy = compileEgress(record.egress ?? CLOSED_EGRESS);
    const slot = this.network.slot(record.slot);
    await this.network.applySandboxFirewall(
      slot,
      sandboxFirewallRules(policy, slot.hostAddr, this.network.cidr, this.gatewayPorts),
    );
    this.gateway.setPolicy(record.addr, policy);
  }

  forget(record: InstanceRecord): void {
    this.gateway.removePolicy(record.addr);
  }

  /** Removes the host rules to the gateway's ports, then closes the gateway. */
  async close(): Promise<void> {
    await this.network.removeGatewayRules();
    await this.gateway.close();
  }
}
