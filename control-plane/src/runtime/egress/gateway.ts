import { createSocket, type RemoteInfo, type Socket as UdpSocket } from "node:dgram";
import { Resolver } from "node:dns/promises";
import { readFileSync } from "node:fs";
import { type AddressInfo, BlockList, connect, createServer, type Server, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import type { Logger } from "@warren/platform/log";
import * as dnsPacket from "dns-packet";
import { type CompiledEgress, domainPermitted, resolvedAddressPermitted } from "./policy.js";
import { readClientHelloSni } from "./tls-sni.js";

/**
 * The node's egress gateway: the two services a sandbox's egress policy needs beyond firewall rules.
 *
 * - A DNS forwarder. Every sandbox's UDP port 53 traffic is redirected here (by the sandbox's own firewall rules),
 *   so DNS works whatever the template's resolv.conf says. It answers a sandbox by its policy: every name when
 *   the default is allow, only permitted domains when the policy is deny-all-but-domains, nothing (REFUSED)
 *   when nothing may leave (no DNS channel out of a closed sandbox).
 * - A domain gateway for policies with domain entries. The sandbox's TCP port 80 and 443 traffic to addresses not
 *   allowed by IP is redirected here; the gateway reads the HTTP Host header or the TLS SNI, checks the name
 *   against the policy, resolves the name itself and connects to that address (never to the address the sandbox
 *   chose), then splices the two connections. So a permitted name cannot be used to reach a denied address, and
 *   a raw connection to an address a permitted name resolves to is still denied (it matches no rule).
 *
 * Sandboxes are told apart by source address (each has its own, set by the node; a sandbox cannot spoof another's
 * because its namespace's routes and addresses are not its to change). Connections from unknown addresses are
 * dropped, so the listeners (on the node's wildcard address, reachable from sandboxes at their host-side address)
 * serve nobody else.
 */
export interface EgressGatewayOptions {
  /** Upstream DNS server `ip` or `ip:port`; default: the first nameserver of the node's /etc/resolv.conf. */
  readonly dnsUpstream?: string;
  /** Addresses the gateway never connects to for a sandbox (the node's own, every sandbox network). */
  readonly forbidden: BlockList;
  readonly log: Logger;
  /** Bytes of a request head or ClientHello the gateway reads before giving up. */
  readonly maxPeekBytes?: number;
  readonly peekTimeoutMs?: number;
}

export interface EgressGatewayPorts {
  readonly dns: number;
  readonly http: number;
  readonly tls: number;
}

const REFUSED = 5;
const SERVFAIL = 2;
const DNS_TIMEOUT_MS = 5_000;

export function defaultDnsUpstream(): string {
  try {
    const match = /^\s*nameserver\s+(\S+)/m.exec(readFileSync("/etc/resolv.conf", "utf8"));
    if (match?.[1]) return match[1];
  } catch {
    // fall through
  }
  return "127.0.0.1";
}

function splitHostPort(value: string): { host: string; port: number } {
  const match = /^(.*?)(?::(\d+))?$/.exec(value);
  return { host: match?.[1] ?? value, port: match?.[2] ? Number(match[2]) : 53 };
}

/**
 * The gateway a node agent runs for its sandboxes: it never connects to the node's own addresses or to anything in
 * the agent's sandbox network `netCidr`.
 */
export function nodeEgressGateway(options: { netCidr: string; log: Logger; dnsUpstream?: string }): EgressGateway {
  const forbidden = new BlockList();
  const [netAddr, netBits] = options.netCidr.split("/");
  forbidden.addSubnet(netAddr as string, Number(netBits), "ipv4");
  for (const addrs of Object.values(networkInterfaces()))
    for (const addr of addrs ?? []) if (addr.family === "IPv4") forbidden.addAddress(addr.address, "ipv4");
  return new EgressGateway({
    forbidden,
    log: options.log.child({ part: "egress" }),
    ...(options.dnsUpstream ? { dnsUpstream: options.dnsUpstream } : {}),
  });
}

export class EgressGateway {
  private readonly policies = new Map<string, CompiledEgress>();
  private readonly upstream: { host: string; port: number };
  private readonly resolver = new Resolver({ timeout: DNS_TIMEOUT_MS, tries: 2 });
  private dnsSocket: UdpSocket | undefined;
  private httpServer: Server | undefined;
  private tlsServer: Server | undefined;
  private readonly connections = new Set<Socket>();

  constructor(private readonly options: EgressGatewayOptions) {
    this.upstream = splitHostPort(options.dnsUpstream ?? defaultDnsUpstream());
    this.resolver.setServers([`${this.upstream.host}:${this.upstream.port}`]);
  }

  /** Starts the three listeners on ephemeral ports (the driver writes them into each sandbox's rules). */
  async start(): Promise<EgressGatewayPorts> {
    const dns = createSocket({ type: "udp4" });
    dns.on("message", (msg, rinfo) => this.onDnsQuery(msg, rinfo));
    dns.on("error", (error) => this.options.log.error("dns forwarder error", { error }));
    await new Promise<void>((resolve) => dns.bind(0, "0.0.0.0", () => resolve()));
    this.dnsSocket = dns;
    this.httpServer = await this.listen((socket) => this.onConnection(socket, "http"));
    this.tlsServer = await this.listen((socket) => this.onConnection(socket, "tls"));
    return this.ports;
  }

  get ports(): EgressGatewayPorts {
    if (!this.dnsSocket || !this.httpServer || !this.tlsServer) throw new Error("egress gateway not started");
    return {
      dns: this.dnsSocket.address().port,
      http: (this.httpServer.address() as AddressInfo).port,
      tls: (this.tlsServer.address() as AddressInfo).port,
    };
  }

  /** The policy the gateway applies to traffic from `addr` (the sandbox's address). */
  setPolicy(addr: string, policy: CompiledEgress): void {
    this.policies.set(addr, policy);
  }

  removePolicy(addr: string): void {
    this.policies.delete(addr);
  }

  async close(): Promise<void> {
    this.dnsSocket?.close();
    for (const socket of this.connections) socket.destroy();
    await Promise.all(
      [this.httpServer, this.tlsServer].map(
        (server) => new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve())),
      ),
    );
  }

  private async listen(onConnection: (socket: Socket) => void): Promise<Server> {
    const server = createServer({ pauseOnConnect: false }, onConnection);
    server.on("error", (error) => this.options.log.error("egress gateway listener error", { error }));
    await new Promise<void>((resolve) => server.listen(0, "0.0.0.0", () => resolve()));
    return server;
  }

  private policyOf(address: string | undefined): CompiledEgress | undefined {
    if (!address) return undefined;
    return this.policies.get(address.startsWith("::ffff:") ? address.slice(7) : address);
  }

  private onDnsQuery(msg: Buffer, rinfo: RemoteInfo): void {
    const policy = this.policyOf(rinfo.address);
    if (!policy) return;
    let query: dnsPacket.DecodedPacket;
    try {
      query = dnsPacket.decode(msg);
    } catch {
      return;
    }
    if (query.type !== "query") return;
    const name = query.questions?.[0]?.name ?? "";
    const permitted = policy.dns === "all" || (policy.dns === "domains" && domainPermitted(policy, name));
    const reply = (buf: Buffer) => this.dnsSocket?.send(buf, rinfo.port, rinfo.address);
    if (!permitted) {
      reply(this.dnsError(query, REFUSED));
      return;
    }
    const upstream = createSocket({ type: "udp4" });
    const timer = setTimeout(() => {
      upstream.close();
      reply(this.dnsError(query, SERVFAIL));
    }, DNS_TIMEOUT_MS);
    upstream.once("message", (answer) => {
      clearTimeout(timer);
      upstream.close();
      reply(answer);
    });
    upstream.once("error", () => {
      clearTimeout(timer);
      upstream.close();
      reply(this.dnsError(query, SERVFAIL));
    });
    upstream.send(msg, this.upstream.port, this.upstream.host);
  }

  private dnsError(query: dnsPacket.DecodedPacket, rcode: number): Buffer {
    const recursionDesired = (query.flags ?? 0) & dnsPacket.RECURSION_DESIRED;
    return dnsPacket.encode({
      type: "response",
      id: query.id ?? 0,
      flags: recursionDesired | dnsPacket.RECURSION_AVAILABLE | rcode,
      questions: query.questions ?? [],
      answers: [],
    });
  }

  private onConnection(socket: Socket, kind: "http" | "tls"): void {
    const policy = this.policyOf(socket.remoteAddress);
    if (!policy || policy.domains.length === 0) {
      socket.destroy();
      return;
    }
    this.connections.add(socket);
    socket.once("close", () => this.connections.delete(socket));
    socket.on("error", () => undefined);
    const maxPeek = this.options.maxPeekBytes ?? 32_768;
    let head = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), this.options.peekTimeoutMs ?? 10_000);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const name = kind === "tls" ? tlsName(head) : httpHost(head);
      if (name === "incomplete" && head.length < maxPeek) return;
      socket.off("data", onData);
      socket.pause();
      clearTimeout(timer);
      const target = typeof name === "string" && name !== "incomplete" && name !== "invalid" ? name : undefined;
      this.forward(socket, kind, head, target, policy).catch((error: unknown) => {
        this.options.log.warn("egress gateway connection failed", { error, kind });
        socket.destroy();
      });
    };
    socket.on("data", onData);
  }

  private async forward(
    socket: Socket,
    kind: "http" | "tls",
    head: Buffer,
    name: string | undefined,
    policy: CompiledEgress,
  ): Promise<void> {
    const deny = (reason: string) => {
      this.options.log.info("egress denied", { sandboxAddr: socket.remoteAddress, kind, name, reason });
      if (kind === "http") {
        const body = `Warren: ${reason}\n`;
        socket.end(
          `HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
        );
      } else socket.destroy();
    };
    if (!name) return deny("no host name in the request; this sandbox may reach only the domains its policy allows");
    if (!domainPermitted(policy, name)) return deny(`'${name}' is not allowed by this sandbox's egress policy`);
    let addresses: string[];
    try {
      addresses = await this.resolver.resolve4(name);
    } catch (error) {
      return deny(`'${name}' does not resolve (${(error as NodeJS.ErrnoException).code ?? "error"})`);
    }
    const address = addresses.find((ip) => resolvedAddressPermitted(policy, ip, this.options.forbidden));
    if (!address) return deny(`'${name}' resolves only to addresses a sandbox may not reach`);
    const upstream = connect({ host: address, port: kind === "tls" ? 443 : 80 });
    this.connections.add(upstream);
    upstream.once("close", () => {
      this.connections.delete(upstream);
      socket.destroy();
    });
    socket.once("close", () => upstream.destroy());
    upstream.on("error", () => socket.destroy());
    upstream.once("connect", () => {
      upstream.write(head);
      socket.pipe(upstream);
      upstream.pipe(socket);
      socket.resume();
    });
  }
}

function tlsName(head: Buffer): string | "incomplete" | "invalid" {
  const result = readClientHelloSni(head);
  if (typeof result === "string") return result;
  return result.name ?? "invalid";
}

/** The Host header of an HTTP/1.x request head (port stripped), once the head is complete. */
export function httpHost(head: Buffer): string | "incomplete" | "invalid" {
  const end = head.indexOf("\r\n\r\n");
  if (end < 0) return "incomplete";
  const lines = head.toString("latin1", 0, end).split("\r\n");
  if (!/^[A-Z]+ \S+ HTTP\/1\.[01]$/.test(lines[0] ?? "")) return "invalid";
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    if (colon > 0 && line.slice(0, colon).trim().toLowerCase() === "host") {
      const value = line.slice(colon + 1).trim();
      const host = value.startsWith("[") ? "" : (value.split(":")[0] ?? "");
      return host.length > 0 ? host : "invalid";
    }
  }
  return "invalid";
}
