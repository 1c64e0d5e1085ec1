import { existsSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { exec, SerialQueue } from "../exec.js";
import { ipString, mac, parseCidr } from "../net-addr.js";
import { GUEST_ADDR, GUEST_GATEWAY, GUEST_MAC, TAP_MAC } from "./guest-image.js";

/**
 * Networking of microVM sandboxes: a network namespace per sandbox holding the VM's tap device, joined to the
 * host by a veth pair with a /30 the agent controls (host .1, sandbox .2), like the namespace driver's.
 *
 * Why NAT inside the namespace: every sandbox is restored from one template snapshot, and the guest's IP
 * configuration is part of that snapshot, so every guest has the same fixed address (192.168.127.2 behind tap0,
 * MACs fixed too so the guest's neighbour cache stays valid after a restore). The namespace translates its
 * per-sandbox address to the guest: DNAT of everything arriving on eth0 for .2 (so any port a guest process
 * listens on is reachable at `<sandbox address>:<port>`), SNAT to the tap's address on the way in, so the guest
 * needs no route beyond its own /30. A restored VM re-opens the same tap in the same namespace: its TCP stack
 * survives (clients may need to reconnect after a checkpoint, processes do not die).
 *
 * Isolation, in two layers (the guest has no route out; these hold even if guest root adds one):
 * - inside the namespace: FORWARD DROP except node → guest and replies; INPUT from the tap DROP except replies
 *   (nothing of the namespace itself is reachable from the guest); IPv6 off;
 * - on the host: this agent's chains drop everything arriving from its microVM veths except replies to the node's
 *   own connections (INPUT), and all forwarding from or to them (FORWARD), so no other sandbox, host service,
 *   link-local address or outside network is reachable.
 * Slots are created per sandbox and deleted with it; no pool yet (13 ms of `ip` calls per create).
 */
export interface VmNetworkSlot {
  readonly index: number;
  readonly netns: string;
  readonly netnsPath: string;
  readonly hostVeth: string;
  readonly hostAddr: string;
  readonly sandboxAddr: string;
}

const NETNS_RULES = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -i eth0 -d SANDBOX_ADDR -j DNAT --to-destination ${GUEST_ADDR}
-A POSTROUTING -o tap0 -j SNAT --to-source ${GUEST_GATEWAY}
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i tap0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A INPUT -i tap0 -j DROP
-A FORWARD -i eth0 -o tap0 -d ${GUEST_ADDR} -j ACCEPT
-A FORWARD -i tap0 -o eth0 -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
COMMIT
`;

const SLOT_SCRIPT = `set -e
ip netns add "$NS"
ip link add "$HV" address "$HMAC" type veth peer name eth0 address "$SMAC" netns "$NS"
sysctl -qw "net.ipv6.conf.$HV.disable_ipv6=1"
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
ip tuntap add tap0 mode tap
ip link set tap0 address "$TMAC"
ip addr add "$GW/30" dev tap0
ip link set tap0 up
ip neigh replace "$GA" lladdr "$GMAC" dev tap0 nud permanent
printf "%s" "$RULES" | iptables-restore
'
`;

export class VmNetwork {
  private readonly base: number;
  private readonly capacity: number;
  private readonly used = new Set<number>();
  /** Next index to hand out: slots are not reused until the range wraps (see acquire). */
  private next = 1;
  private readonly firewall = new SerialQueue();
  readonly inputChain: string;
  readonly forwardChain: string;

  constructor(
    private readonly instance: string,
    cidr: string,
  ) {
    if (!/^[a-z0-9]{1,4}$/.test(instance)) throw new Error(`invalid instance tag '${instance}'`);
    const { base, slots } = parseCidr(cidr);
    this.base = base;
    this.capacity = slots;
    const tag = instance.toUpperCase();
    this.inputChain = `WARREN-${tag}-VMIN`;
    this.forwardChain = `WARREN-${tag}-VMFWD`;
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
    };
  }

  /** This agent's host chains: replies only from its microVM veths, no forwarding from or to them; idempotent. */
  async start(): Promise<void> {
    await this.firewall.run(async () => {
      const veths = `${this.vethPrefix}+`;
      const rules: [string, string, string[][]][] = [
        [
          this.inputChain,
          "INPUT",
          [
            ["-i", veths, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
            ["-i", veths, "-j", "DROP"],
          ],
        ],
        [
          this.forwardChain,
          "FORWARD",
          [
            ["-i", veths, "-j", "DROP"],
            ["-o", veths, "-j", "DROP"],
          ],
        ],
      ];
      for (const [chain, parent, body] of rules) {
        await exec("iptables", ["-w", "-N", chain], { allowFailure: true });
        await exec("iptables", ["-w", "-F", chain]);
        for (const rule of body) await exec("iptables", ["-w", "-A", chain, ...rule]);
        const present = await exec("iptables", ["-w", "-C", parent, "-j", chain], { allowFailure: true });
        if (present.code !== 0) await exec("iptables", ["-w", "-I", parent, "1", "-j", chain]);
      }
    });
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
        RULES: NETNS_RULES.replace("SANDBOX_ADDR", slot.sandboxAddr),
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
