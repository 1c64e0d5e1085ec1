import { existsSync } from "node:fs";
import { readdir } from "node:fs/promises";
import type { Logger } from "@warren/platform/log";
import { removeHostChains } from "../egress/host-chains.js";
import { CLOSED_EGRESS, type CompiledEgress, compileEgress } from "../egress/policy.js";
import type { GatewayPorts } from "../egress/rules.js";
import { enableUplinkForwarding, SANDBOX_INTERFACES } from "../egress/uplink.js";
import { exec, SerialQueue } from "../exec.js";
import { ipString, mac, parseCidr } from "../net-addr.js";
import { vmNamespaceRules } from "./egress.js";
import { GUEST_ADDR, GUEST_GATEWAY, GUEST_MAC, TAP_MAC } from "./guest-image.js";

/**
 * Networking of microVM sandboxes: a network namespace per sandbox holding the VM's tap device, joined to the
 * host by a veth pair with a /30 the agent controls (host .1, sandbox .2), like the namespace driver's.
 *
 * Why NAT inside the namespace: every sandbox is restored from one template snapshot, and the guest's IP
 * configuration is part of that snapshot, so every guest has the same fixed address (192.168.127.2 behind tap0,
 * MACs fixed too so the guest's neighbour cache stays valid after a restore). The namespace translates its
 * per-sandbox address to the guest and back (egress.ts): any port a guest process listens on is reachable at
 * `<sandbox address>:<port>`, and what the guest sends out leaves with the sandbox address. A restored VM re-opens
 * the same tap in the same namespace: its TCP stack survives (clients may need to reconnect after a checkpoint,
 * processes do not die).
 *
 * Isolation, in two layers (the guest's routes are its own; these hold whatever guest root does):
 * - inside the namespace (egress.ts): the sandbox's egress policy with Warren's floor, forwarding only what
 *   carries the guest's address; nothing of the namespace itself answers the guest; IPv6 off;
 * - on the host: this agent's chains accept from its microVM veths only replies and the egress gateway's ports
 *   (INPUT), and forward from them only with their sandbox addresses (strict reverse-path filter on each veth),
 *   never to another sandbox's veth (any agent's, either driver) or link-local addresses; towards them only
 *   replies. Egress leaves the node masqueraded with its address.
 * Slots are created per sandbox and deleted with it; no pool yet (13 ms of `ip` calls per create).
 */
export interface VmNetworkSlot {
  readonly index: number;
  readonly netns: string;
  readonly netnsPath: string;
  readonly hostVeth: string;
  readonly hostAddr: string;
  readonly sandboxAddr: string;
  /**
   * The uid (and gid) the slot's QEMU runs as (jail.ts `jailArgs`): 2^30 + the /30's number in the IPv4 space.
   * Unique on the host without any registry, because no two agents' sandbox networks overlap; far above
   * distributions' user ranges and the namespace driver's mapped ids (100000 + 65536 per agent by default).
   */
  readonly qemuUid: number;
}

export const QEMU_UID_BASE = 2 ** 30;

const SLOT_SCRIPT = `set -e
ip netns add "$NS"
ip link add "$HV" address "$HMAC" type veth peer name eth0 address "$SMAC" netns "$NS"
sysctl -qw "net.ipv6.conf.$HV.disable_ipv6=1" "net.ipv4.conf.$HV.forwarding=1" "net.ipv4.conf.$HV.rp_filter=1"
ip addr add "$HIP/30" dev "$HV"
ip link set "$HV" up
ip neigh replace "$SIP" lladdr "$SMAC" dev "$HV" nud permanent
ip netns exec "$NS" sh -c '
set -e
sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 net.ipv4.ip_forward=1
ip link set lo up
ip addr add "$SIP/30" dev eth0
ip link set eth0 up
ip neigh replace "$HIP" lladdr "$HMAC" dev eth0 nud permanent
ip route add default via "$HIP" dev eth0
ip tuntap add tap0 mode tap
ip link set tap0 address "$TMAC"
ip addr add "$GW/30" dev tap0
ip link set tap0 up
ip neigh replace "$GA" lladdr "$GMAC" dev tap0 nud permanent
printf "%s" "$RULES" | iptables-restore -w
'
`;

export interface VmNetworkOptions {
  /** Short tag separating this agent's names from another agent's on the same host ([a-z0-9]{1,4}). */
  readonly instance: string;
  /** IPv4 network carved into one /30 per sandbox. */
  readonly cidr: string;
  readonly log: Logger;
  /** See NetworkPoolOptions.uplinkForwarding (default on). */
  readonly uplinkForwarding?: boolean;
}

export class VmNetwork {
  private readonly base: number;
  private readonly capacity: number;
  private readonly used = new Set<number>();
  /** Next index to hand out: slots are not reused until the range wraps (see acquire). */
  private next = 1;
  private readonly firewall = new SerialQueue();
  readonly inputChain: string;
  readonly forwardChain: string;
  readonly natChain: string;
  private readonly instance: string;
  /** The egress gateway's ports, written into every slot's rules (set by `start`). */
  private gateway: GatewayPorts | undefined;

  constructor(private readonly options: VmNetworkOptions) {
    this.instance = options.instance;
    if (!/^[a-z0-9]{1,4}$/.test(this.instance)) throw new Error(`invalid instance tag '${this.instance}'`);
    const { base, slots } = parseCidr(options.cidr);
    this.base = base;
    this.capacity = slots;
    const tag = this.instance.toUpperCase();
    this.inputChain = `WARREN-${tag}-VMIN`;
    this.forwardChain = `WARREN-${tag}-VMFWD`;
    this.natChain = `WARREN-${tag}-VMNAT`;
  }

  get cidr(): string {
    return this.options.cidr;
  }

  private get uplinkTag(): string {
    return `warren:${this.instance}:vmuplink`;
  }

  get netnsPrefix(): string {
    return `warren-${this.instance}-vm`;
  }

  get vethPrefix(): string {
    return `wv-${this.instance}-`;
  }

  slot(index: number): VmNetworkSlot {
    const net = this.base + index * 4;
    return {
      index,
      netns: `${this.netnsPrefix}${index}`,
      netnsPath: `/run/netns/${this.netnsPrefix}${index}`,
      hostVeth: `${this.vethPrefix}${index}`,
      hostAddr: ipString(net + 1),
      sandboxAddr: ipString(net + 2),
      qemuUid: QEMU_UID_BASE + (Math.floor(net / 4) % QEMU_UID_BASE),
    };
  }

  /**
   * This agent's host chains, each replaced atomically (idempotent): INPUT from its microVM veths only replies and,
   * with `gateway`, the egress gateway's ports; forwarding from them only from sandbox addresses to anything but
   * sandboxes and link-local; towards them only replies; egress masqueraded. Without `gateway` (agent stopping)
   * nothing of the node answers the guests any more.
   */
  async start(gateway?: GatewayPorts): Promise<void> {
    this.gateway = gateway;
    await this.firewall.run(async () => {
      const veths = `${this.vethPrefix}+`;
      // The uplink rule (added once, when this agent turned uplink forwarding on) survives the rewrite.
      const kept = (await exec("iptables", ["-w", "-S", this.forwardChain], { allowFailure: true })).stdout
        .split("\n")
        .filter((line) => line.startsWith("-A ") && line.includes(this.uplinkTag));
      const input = [
        `-A ${this.inputChain} -i ${veths} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`,
        ...(gateway
          ? [
              `-A ${this.inputChain} -i ${veths} -p udp --dport ${gateway.dns} -j ACCEPT`,
              `-A ${this.inputChain} -i ${veths} -p tcp -m multiport --dports ${gateway.http},${gateway.tls} -j ACCEPT`,
            ]
          : []),
        `-A ${this.inputChain} -i ${veths} -j DROP`,
      ];
      const forward = [
        ...SANDBOX_INTERFACES.map((iface) => `-A ${this.forwardChain} -i ${veths} -o ${iface} -j DROP`),
        `-A ${this.forwardChain} -i ${veths} -d 169.254.0.0/16 -j DROP`,
        `-A ${this.forwardChain} -i ${veths} -s ${this.options.cidr} -j ACCEPT`,
        `-A ${this.forwardChain} -i ${veths} -j DROP`,
        `-A ${this.forwardChain} -o ${veths} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`,
        `-A ${this.forwardChain} -o ${veths} -j DROP`,
        ...kept,
      ];
      const rules = [
        "*filter",
        `:${this.inputChain} - [0:0]`,
        `:${this.forwardChain} - [0:0]`,
        ...input,
        ...forward,
        "COMMIT",
        "*nat",
        `:${this.natChain} - [0:0]`,
        `-A ${this.natChain} -s ${this.options.cidr} ! -o wv-+ -j MASQUERADE`,
        "COMMIT",
        "",
      ].join("\n");
      const result = await exec("iptables-restore", ["-w", "--noflush"], { input: rules, allowFailure: true });
      if (result.code !== 0) throw new Error(`microVM host firewall failed: ${result.stderr.trim()}`);
      for (const [table, chain, parent] of [
        ["filter", this.inputChain, "INPUT"],
        ["filter", this.forwardChain, "FORWARD"],
        ["nat", this.natChain, "POSTROUTING"],
      ] as const) {
        const jump = ["-w", "-t", table];
        const present = await exec("iptables", [...jump, "-C", parent, "-j", chain], { allowFailure: true });
        if (present.code !== 0) await exec("iptables", [...jump, "-I", parent, "1", "-j", chain]);
      }
      if (this.options.uplinkForwarding !== false)
        await enableUplinkForwarding(this.forwardChain, this.uplinkTag, this.options.log);
    });
  }

  /** Removes this agent's host chains and the jumps to them (host-chains.ts): it stopped with no sandbox left. */
  async removeChains(): Promise<void> {
    const chains = { input: this.inputChain, forward: this.forwardChain, nat: this.natChain };
    await this.firewall.run(() => removeHostChains(chains, this.uplinkTag, this.options.log));
  }

  /** The namespace firewall of a slot for a policy (egress.ts), with this node's gateway ports. */
  rules(slot: VmNetworkSlot, policy: CompiledEgress): string {
    return vmNamespaceRules(slot.sandboxAddr, slot.hostAddr, policy, this.options.cidr, this.gateway);
  }

  /** Replaces the firewall (nat and filter tables) inside the slot's namespace, atomically; the way out is the host. */
  async applyRules(slot: VmNetworkSlot, policy: CompiledEgress): Promise<void> {
    const result = await exec(
      "nsenter",
      [`--net=${slot.netnsPath}`, "sh", "-c", 'ip route replace default via "$HIP" dev eth0 && iptables-restore -w'],
      { env: { HIP: slot.hostAddr }, input: this.rules(slot, policy), allowFailure: true },
    );
    if (result.code !== 0) throw new Error(`microVM namespace firewall update failed: ${result.stderr.trim()}`);
  }

  /** Marks slots in use (re-adopted instances) before new ones are handed out. */
  reserve(index: number): void {
    this.used.add(index);
    this.next = Math.max(this.next, index + 1);
  }

  /**
   * Creates a fresh slot. Addresses are handed out round-robin, not lowest-free: a client's keep-alive
   * connection to a killed sandbox's address must not land in the next sandbox that would get it.
   */
  async acquire(): Promise<VmNetworkSlot> {
    for (let step = 0; step < this.capacity - 1; step++) {
      const index = ((this.next - 1 + step) % (this.capacity - 1)) + 1;
      if (this.used.has(index)) continue;
      const slot = this.slot(index);
      if (existsSync(slot.netnsPath)) continue;
      this.used.add(index);
      this.next = index + 1;
      try {
        await this.create(slot);
        return slot;
      } catch (error) {
        await this.remove(slot).catch(() => undefined);
        this.used.delete(index);
        throw error;
      }
    }
    throw new Error(`no free microVM network slot in ${this.capacity} slots`);
  }

  private async create(slot: VmNetworkSlot): Promise<void> {
    const net = this.base + slot.index * 4;
    await exec("sh", ["-c", SLOT_SCRIPT], {
      env: {
        NS: slot.netns,
        HV: slot.hostVeth,
        HIP: slot.hostAddr,
        SIP: slot.sandboxAddr,
        HMAC: mac(0xa1, net + 1),
        SMAC: mac(0xa1, net + 2),
        TMAC: TAP_MAC,
        GMAC: GUEST_MAC,
        GW: GUEST_GATEWAY,
        GA: GUEST_ADDR,
        // Closed until the driver applies the instance's policy.
        RULES: this.rules(slot, compileEgress(CLOSED_EGRESS)),
      },
    });
  }

  async release(slot: VmNetworkSlot): Promise<void> {
    await this.remove(slot);
    this.used.delete(slot.index);
  }

  private async remove(slot: VmNetworkSlot): Promise<void> {
    await exec("ip", ["link", "del", slot.hostVeth], { allowFailure: true });
    await exec("ip", ["netns", "del", slot.netns], { allowFailure: true });
  }

  /** Deletes this agent's microVM namespaces and veths that no kept instance owns. */
  async sweep(keep: ReadonlySet<number>): Promise<void> {
    const names = existsSync("/run/netns") ? await readdir("/run/netns") : [];
    for (const name of names) {
      if (!name.startsWith(this.netnsPrefix)) continue;
      const index = Number(name.slice(this.netnsPrefix.length));
      if (Number.isInteger(index) && !keep.has(index)) await this.remove(this.slot(index));
    }
    for (const name of await readdir("/sys/class/net")) {
      if (!name.startsWith(this.vethPrefix)) continue;
      const index = Number(name.slice(this.vethPrefix.length));
      if (Number.isInteger(index) && !keep.has(index)) await this.remove(this.slot(index));
    }
  }
}
