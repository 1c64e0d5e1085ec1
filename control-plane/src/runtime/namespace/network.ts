import { existsSync } from "node:fs";
import { readdir, writeFile } from "node:fs/promises";
import type { Logger } from "@warren/platform/log";
import { removeHostChains } from "../egress/host-chains.js";
import { enableUplinkForwarding, SANDBOX_INTERFACES } from "../egress/uplink.js";
import { exec, SerialQueue } from "../exec.js";
import { ipString, mac, parseCidr } from "../net-addr.js";

/**
 * Sandbox networking: every sandbox gets its own network namespace with one veth pair to the host and a /30 the
 * agent controls (host side .1, sandbox .2). Namespaces are made ahead of time in a pool, fully configured
 * (addresses up, static neighbour entries both ways), so a create never waits for the kernel's 1 s ARP retry
 * (RUNTIME-NOTES §2.5) and the node can reach envd (49983), the gateway (49999) and any port a sandbox listens on
 * at `<sandbox address>:<port>`.
 *
 * Isolation, in two independent layers:
 * - inside the sandbox's namespace (owned by the host's user namespace, so sandbox root has no CAP_NET_ADMIN
 *   over it and cannot change any of this): the default route points at the host side, and the namespace's
 *   firewall is the sandbox's egress policy (egress-rules.ts: Warren's floor, then the policy; a slot starts closed,
 *   OUTPUT DROP except loopback and replies with new connections REJECTed, or with the rules `prepareRules` gives);
 *   IPv6 is disabled;
 * - on the host: per-slot rules in this agent's chains drop everything from the sandbox's veth to the host itself
 *   (INPUT) except replies to the node's own connections and the egress gateway's ports, and drop forwarding to
 *   other sandboxes and link-local addresses and anything not from the sandbox's own address (FORWARD).
 * Slots are never reused: a killed sandbox's namespace, veth and rules are deleted, and the pool makes new ones.
 */
export interface NetworkSlot {
  readonly index: number;
  readonly netns: string;
  /** /run/netns path the sandbox joins. */
  readonly netnsPath: string;
  readonly hostVeth: string;
  readonly hostAddr: string;
  readonly sandboxAddr: string;
}

export interface NetworkPoolOptions {
  /** Short tag separating this agent's names from another agent's on the same host ([a-z0-9]{1,4}). */
  readonly instance: string;
  /** IPv4 network (e.g. 10.201.0.0/16) carved into one /30 per sandbox. */
  readonly cidr: string;
  /** Namespaces kept ready. */
  readonly poolSize: number;
  readonly log: Logger;
  /**
   * Turn on IPv4 forwarding for the interface of the node's default route, so replies to sandbox egress come back
   * (each sandbox veth gets forwarding too). Only that interface, not `ip_forward` for all; off when the operator
   * manages forwarding (or wants no egress at all).
   */
  readonly uplinkForwarding?: boolean;
  /**
   * envd's static launcher, which sets a new namespace up in one exec (`warren-exec --netns-setup`: NAMESPACE_SETUP's
   * steps) where it is built; otherwise `nsenter` runs NAMESPACE_SETUP.
   */
  readonly launcher?: string;
}

/** Firewall of the sandbox's own namespace: nothing leaves except replies and loopback. */
const SANDBOX_RULES = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
-A OUTPUT -o lo -j ACCEPT
-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
-A OUTPUT -j REJECT --reject-with icmp-admin-prohibited
COMMIT
`;

/**
 * Inside a new slot's namespace (run by `nsenter --net`; `warren-exec --netns-setup` does the same in one exec), its
 * kernel settings, then its firewall (the rules on stdin). The settings are written by the shell itself (no `sysctl`
 * exec: a refill's CPU is mostly its execs).
 * `ip_nonlocal_bind`: a fork restored from a memory snapshot (CRIU) into another slot re-binds the source's
 * listening sockets at the source's address (envd's loopback forwards, a server bound to that address), which fails
 * without it; such sockets then never see traffic, and sending from an address that is not local still fails (the
 * kernel's route lookup refuses it without IP_TRANSPARENT, which needs CAP_NET_ADMIN the sandbox does not have
 * here), so no sandbox can speak with another's address.
 */
const NAMESPACE_SETUP = `set -e
echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6
echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start
echo "0 2147483647" > /proc/sys/net/ipv4/ping_group_range
echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind
exec iptables-restore
`;

export class NetworkPool {
  private readonly base: number;
  private readonly capacity: number;
  private readonly used = new Set<number>();
  private readonly ready: NetworkSlot[] = [];
  private readonly firewall = new SerialQueue();
  /** The rules each slot's own namespace holds now (as last applied), so the same rules are never applied twice. */
  private readonly namespaceRules = new Map<number, string>();
  /** Slots whose host rules this agent added (and can delete by their spec). */
  private readonly hostRulesAdded = new Set<number>();
  /** The rules a new slot's namespace starts with; closed until `prepareRules` says otherwise. */
  private initialRules: (slot: NetworkSlot) => string = () => SANDBOX_RULES;
  private refilling: Promise<void> | undefined;
  private closed = false;
  readonly inputChain: string;
  readonly forwardChain: string;
  readonly natChain: string;

  constructor(private readonly options: NetworkPoolOptions) {
    if (!/^[a-z0-9]{1,4}$/.test(options.instance)) throw new Error(`invalid instance tag '${options.instance}'`);
    const { base, slots } = parseCidr(options.cidr);
    this.base = base;
    this.capacity = slots;
    const tag = options.instance.toUpperCase();
    this.inputChain = `WARREN-${tag}-IN`;
    this.forwardChain = `WARREN-${tag}-FWD`;
    this.natChain = `WARREN-${tag}-NAT`;
  }

  get cidr(): string {
    return this.options.cidr;
  }

  get netnsPrefix(): string {
    return `warren-${this.options.instance}-`;
  }

  get vethPrefix(): string {
    return `wr-${this.options.instance}-`;
  }

  /** The comment tagging every host rule of a slot. */
  ruleTag(index: number): string {
    return `warren:${this.options.instance}:${index}`;
  }

  slot(index: number): NetworkSlot {
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

  /** Creates this agent's firewall chains and the jumps to them; idempotent. */
  async start(): Promise<void> {
    await this.firewall.run(async () => {
      for (const [chain, parent] of [
        [this.inputChain, "INPUT"],
        [this.forwardChain, "FORWARD"],
      ] as const) {
        await exec("iptables", ["-w", "-N", chain], { allowFailure: true });
        const present = await exec("iptables", ["-w", "-C", parent, "-j", chain], { allowFailure: true });
        if (present.code !== 0) await exec("iptables", ["-w", "-I", parent, "1", "-j", chain]);
      }
      if (this.options.uplinkForwarding !== false) await this.enableUplinkForwarding();
      // Sandbox egress leaves with the node's address (the rest of the network knows no sandbox address).
      await exec("iptables", ["-w", "-t", "nat", "-N", this.natChain], { allowFailure: true });
      const jump = ["POSTROUTING", "-j", this.natChain];
      if ((await exec("iptables", ["-w", "-t", "nat", "-C", ...jump], { allowFailure: true })).code !== 0)
        await exec("iptables", ["-w", "-t", "nat", "-I", ...jump]);
      const masquerade = ["-s", this.options.cidr, "!", "-o", "wr-+", "-j", "MASQUERADE"];
      if (
        (await exec("iptables", ["-w", "-t", "nat", "-C", this.natChain, ...masquerade], { allowFailure: true }))
          .code !== 0
      )
        await exec("iptables", ["-w", "-t", "nat", "-A", this.natChain, ...masquerade]);
    });
  }

  /** Removes this agent's host chains and the jumps to them (host-chains.ts): it stopped with no sandbox left. */
  async removeChains(): Promise<void> {
    const chains = { input: this.inputChain, forward: this.forwardChain, nat: this.natChain };
    await this.firewall.run(() => removeHostChains(chains, this.uplinkTag, this.options.log));
  }

  /**
   * Lets this agent's sandboxes reach the egress gateway's ports on their host-side address (and nothing else of
   * the host): rules at the top of the input chain, replaced whenever the gateway's ports change (agent restart).
   */
  async allowGateway(ports: { readonly dns: number; readonly http: number; readonly tls: number }): Promise<void> {
    const tag = await this.removeGatewayRules();
    const iface = `${this.vethPrefix}+`;
    await this.restore(
      [
        `-I ${this.inputChain} 1 -i ${iface} -p udp --dport ${ports.dns} -m comment --comment ${tag} -j ACCEPT`,
        `-I ${this.inputChain} 1 -i ${iface} -p tcp -m multiport --dports ${ports.http},${ports.tls} -m comment --comment ${tag} -j ACCEPT`,
      ],
      false,
    );
  }

  /** The tag of the uplink rules an earlier version kept in this agent's forward chain (uplink.ts moves them). */
  private get uplinkTag(): string {
    return `warren:${this.options.instance}:uplink`;
  }

  private enableUplinkForwarding(): Promise<void> {
    // The node forwarded nothing arriving on its uplink before; keep it so for everything but sandbox traffic.
    return enableUplinkForwarding(this.forwardChain, this.uplinkTag, this.options.log);
  }

  /**
   * Removes the gateway rules (when the agent stops: nothing listens on those ports any more, and another process
   * could). Sandboxes left running have no DNS until the next agent start re-opens the new ports.
   */
  async removeGatewayRules(): Promise<string> {
    const tag = `warren:${this.options.instance}:gateway`;
    const old = (await this.ownRules()).filter((line) => line.includes(tag));
    if (old.length > 0)
      await this.restore(
        old.map((line) => line.replace(/^-A /, "-D ")),
        true,
      );
    return tag;
  }

  /** Replaces the firewall (filter and nat tables) and default route inside the slot's namespace, atomically. */
  async applySandboxFirewall(slot: NetworkSlot, rules: string): Promise<void> {
    // A slot made ready with these rules (the usual policy, `prepareRules`) needs no exec on the create path.
    if (this.namespaceRules.get(slot.index) === rules) return;
    this.namespaceRules.delete(slot.index);
    const result = await exec(
      "nsenter",
      [`--net=${slot.netnsPath}`, "sh", "-c", 'ip route replace default via "$HIP" dev eth0 && iptables-restore -w'],
      { env: { HIP: slot.hostAddr }, input: rules, allowFailure: true },
    );
    if (result.code !== 0) throw new Error(`sandbox firewall update failed: ${result.stderr.trim()}`);
    this.namespaceRules.set(slot.index, rules);
  }

  /**
   * The rules slots made from now on start with (their namespace's firewall, applied with the rest of the slot in
   * the background): the policy most creates ask for, so their start skips its ~40 ms of nsenter and
   * iptables-restore. A slot waits unused until a create takes it, and a create whose policy differs applies its
   * own before anything runs in the namespace.
   */
  prepareRules(rules: (slot: NetworkSlot) => string): void {
    this.initialRules = rules;
  }

  /** Marks slots in use by adopted sandboxes, then deletes every other namespace, veth and rule of this agent. */
  async sweep(keep: ReadonlySet<number>): Promise<number[]> {
    for (const index of keep) this.used.add(index);
    const orphans = new Set<number>();
    const netnsNames = existsSync("/run/netns") ? await readdir("/run/netns") : [];
    for (const name of netnsNames) {
      if (name.startsWith(this.netnsPrefix)) orphans.add(Number(name.slice(this.netnsPrefix.length)));
    }
    for (const name of await readdir("/sys/class/net")) {
      if (name.startsWith(this.vethPrefix)) orphans.add(Number(name.slice(this.vethPrefix.length)));
    }
    for (const line of await this.ownRules()) {
      const match = new RegExp(`warren:${this.options.instance}:(\\d+)`).exec(line);
      if (match) orphans.add(Number(match[1]));
    }
    const removed: number[] = [];
    for (const index of orphans) {
      if (keep.has(index) || !Number.isInteger(index)) continue;
      await this.destroy(this.slot(index));
      removed.push(index);
    }
    return removed;
  }

  /** A configured namespace: from the pool when one is ready, else made now. */
  async acquire(): Promise<NetworkSlot> {
    const slot = this.ready.shift() ?? (await this.make());
    this.refill();
    return slot;
  }

  /** Deletes the slot's veth pair, namespace and host rules (slots are never reused). */
  async release(slot: NetworkSlot): Promise<void> {
    await this.destroy(slot);
  }

  get readyCount(): number {
    return this.ready.length;
  }

  /** Tops the pool up in the background. */
  refill(): void {
    if (this.refilling || this.closed) return;
    this.refilling = (async () => {
      while (!this.closed && this.ready.length < this.options.poolSize) {
        try {
          this.ready.push(await this.make());
        } catch (error) {
          this.options.log.error("network pool refill failed", { error });
          break;
        }
      }
    })().finally(() => {
      this.refilling = undefined;
    });
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.refilling;
    const slots = this.ready.splice(0);
    for (const slot of slots) await this.destroy(slot);
  }

  private allocate(): number {
    for (let i = 0; i < this.capacity; i++) {
      if (!this.used.has(i)) {
        this.used.add(i);
        return i;
      }
    }
    throw new Error(`no free sandbox network in ${this.options.cidr}`);
  }

  private async make(): Promise<NetworkSlot> {
    const index = this.allocate();
    const slot = this.slot(index);
    const net = this.base + index * 4;
    const rules = this.initialRules(slot);
    const { netns, hostVeth, hostAddr, sandboxAddr } = slot;
    const hostMac = mac(0x57, net + 1);
    const sandboxMac = mac(0x58, net + 2);
    try {
      // Four execs: the namespace and the host side, the sandbox side, the namespace's settings and firewall, and
      // (below) the host rules. The host side's settings are the agent's own writes.
      await exec("ip", ["-batch", "-"], {
        input: lines(
          `netns add ${netns}`,
          `link add ${hostVeth} address ${hostMac} type veth peer name eth0 address ${sandboxMac} netns ${netns}`,
          `addr add ${hostAddr}/30 dev ${hostVeth}`,
          `link set ${hostVeth} up`,
          `neigh replace ${sandboxAddr} lladdr ${sandboxMac} dev ${hostVeth} nud permanent`,
        ),
      });
      await writeFile(`/proc/sys/net/ipv6/conf/${hostVeth}/disable_ipv6`, "1");
      await writeFile(`/proc/sys/net/ipv4/conf/${hostVeth}/forwarding`, "1");
      await exec("ip", ["-n", netns, "-batch", "-"], {
        input: lines(
          "link set lo up",
          `addr add ${sandboxAddr}/30 dev eth0`,
          "link set eth0 up",
          `neigh replace ${hostAddr} lladdr ${hostMac} dev eth0 nud permanent`,
          `route add default via ${hostAddr} dev eth0`,
        ),
      });
      const { launcher } = this.options;
      if (launcher && existsSync(launcher)) await exec(launcher, ["--netns-setup", slot.netnsPath], { input: rules });
      else await exec("nsenter", [`--net=${slot.netnsPath}`, "sh", "-c", NAMESPACE_SETUP], { input: rules });
      this.namespaceRules.set(index, rules);
      await this.restore(this.hostRules(slot), false);
      this.hostRulesAdded.add(index);
      return slot;
    } catch (error) {
      await this.destroy(slot).catch(() => undefined);
      throw error;
    }
  }

  /** The host rules of a slot (`-A` lines): its input and forward rules, tagged with the slot's comment. */
  private hostRules(slot: NetworkSlot): string[] {
    const comment = `-m comment --comment ${this.ruleTag(slot.index)}`;
    return [
      `-A ${this.inputChain} -i ${slot.hostVeth} -m conntrack --ctstate ESTABLISHED,RELATED ${comment} -j ACCEPT`,
      `-A ${this.inputChain} -i ${slot.hostVeth} ${comment} -j DROP`,
      // Egress: never to another sandbox (any agent's, either driver's) or link-local; the rest is the
      // sandbox's own policy, enforced inside its namespace (egress-rules.ts). Inbound: only replies.
      ...SANDBOX_INTERFACES.map(
        (iface) => `-A ${this.forwardChain} -i ${slot.hostVeth} -o ${iface} ${comment} -j DROP`,
      ),
      `-A ${this.forwardChain} -i ${slot.hostVeth} -d 169.254.0.0/16 ${comment} -j DROP`,
      `-A ${this.forwardChain} -i ${slot.hostVeth} -s ${slot.sandboxAddr} ${comment} -j ACCEPT`,
      `-A ${this.forwardChain} -i ${slot.hostVeth} ${comment} -j DROP`,
      `-A ${this.forwardChain} -o ${slot.hostVeth} -m conntrack --ctstate ESTABLISHED,RELATED ${comment} -j ACCEPT`,
      `-A ${this.forwardChain} -o ${slot.hostVeth} ${comment} -j DROP`,
    ];
  }

  /**
   * Deletes the slot's veth pair and namespace (one `ip`), then its host rules: those this agent added are deleted
   * by their spec (no listing of the chains on a kill); any other slot (adopted, or made half way) by listing the
   * chains for its tag.
   */
  private async destroy(slot: NetworkSlot): Promise<void> {
    this.namespaceRules.delete(slot.index);
    await exec("ip", ["-force", "-batch", "-"], {
      input: `link del ${slot.hostVeth}\nnetns del ${slot.netns}\n`,
      allowFailure: true,
    });
    const added = this.hostRulesAdded.delete(slot.index);
    const deleted = added && (await this.restoreOnce(this.hostRules(slot).map((line) => line.replace(/^-A /, "-D "))));
    if (!deleted) {
      const tag = this.ruleTag(slot.index);
      const tagged = new RegExp(`(^|[\\s"])${tag}(["\\s]|$)`);
      const mine = (await this.ownRules()).filter((line) => tagged.test(line));
      if (mine.length > 0)
        await this.restore(
          mine.map((line) => line.replace(/^-A /, "-D ")),
          true,
        );
    }
    this.used.delete(slot.index);
  }

  /** This agent's host rules, as `iptables -S` lines. */
  async ownRules(): Promise<string[]> {
    const lines: string[] = [];
    for (const chain of [this.inputChain, this.forwardChain]) {
      const { stdout } = await exec("iptables", ["-w", "-S", chain], { allowFailure: true });
      lines.push(...stdout.split("\n").filter((line) => line.startsWith("-A ")));
    }
    return lines;
  }

  /** One `iptables-restore --noflush` of `lines`: whether it applied (all of them, or none). */
  private restoreOnce(lines: readonly string[]): Promise<boolean> {
    return this.firewall.run(async () => {
      const input = `*filter\n${lines.join("\n")}\nCOMMIT\n`;
      const result = await exec("iptables-restore", ["-w", "--noflush"], { input, allowFailure: true });
      return result.code === 0;
    });
  }

  private restore(lines: readonly string[], tolerant: boolean): Promise<void> {
    return this.firewall.run(async () => {
      const input = `*filter\n${lines.join("\n")}\nCOMMIT\n`;
      for (let attempt = 0; ; attempt++) {
        const result = await exec("iptables-restore", ["-w", "--noflush"], { input, allowFailure: true });
        if (result.code === 0) return;
        if (attempt >= 4) {
          if (tolerant) return;
          throw new Error(`iptables-restore failed: ${result.stderr.trim()}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 20 * (attempt + 1)));
      }
    });
  }
}

/** `ip -batch` input: one command per line. */
function lines(...commands: readonly string[]): string {
  return `${commands.join("\n")}\n`;
}
