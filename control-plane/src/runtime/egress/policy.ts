import { BlockList, isIP } from "node:net";

/**
 * A sandbox's egress policy, in E2B's terms (SandboxNetworkConfig.allowOut / denyOut), after the control plane has
 * folded in `allow_internet_access` and the team's limits: `allowInternetAccess: false` is `denyOut: [ALL_TRAFFIC]`.
 *
 * Semantics (E2B's, plus Warren's fixed floor):
 * - `allowOut` entries win over `denyOut` entries; an address matching neither follows the default, which is
 *   "allow" unless `denyOut` holds ALL_TRAFFIC.
 * - `allowOut` may hold domains (`example.com`, `*.example.com`): allowed only with ALL_TRAFFIC denied. They are
 *   enforced by the node's domain gateway (HTTP Host on port 80, TLS SNI on port 443), which resolves the name
 *   itself, so a raw connection to an address a permitted name resolves to is still denied unless allowed by IP.
 * - Warren's floor, whatever the policy says: link-local (cloud metadata), loopback, multicast and reserved
 *   ranges are never reachable, nor are the node itself or any sandbox (enforced by the driver's host rules).
 * - Private ranges (RFC 1918, carrier-grade NAT) are denied unless an `allowOut` CIDR or IP names them: a platform
 *   team's internal network is not "the internet".
 * - IPv6 entries are accepted and ignored: sandboxes have no IPv6.
 */
export interface EgressPolicy {
  readonly allowOut: readonly string[];
  readonly denyOut: readonly string[];
}

export const ALL_TRAFFIC = "0.0.0.0/0";
/** E2B's default: internet access on, no rules. */
export const OPEN_EGRESS: EgressPolicy = { allowOut: [], denyOut: [] };
/** Nothing leaves the sandbox. */
export const CLOSED_EGRESS: EgressPolicy = { allowOut: [], denyOut: [ALL_TRAFFIC] };

/** Never reachable from a sandbox, whatever its policy. */
export const NEVER_REACHABLE = ["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4"] as const;

/** Reachable only when an `allowOut` CIDR or IP names them. */
export const PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"] as const;

export class EgressPolicyError extends Error {
  readonly code = "invalid_egress_policy";
  constructor(message: string) {
    super(message);
    this.name = "EgressPolicyError";
  }
}

export type AddressEntry = {
  readonly kind: "cidr";
  readonly family: 4 | 6;
  readonly addr: string;
  readonly bits: number;
};
export type DomainEntry = { readonly kind: "domain"; readonly name: string; readonly wildcard: boolean };

/** An IP address or CIDR, or undefined when the entry is neither. */
export function parseAddressEntry(entry: string): AddressEntry | undefined {
  const [addr, prefix, ...rest] = entry.split("/");
  if (rest.length > 0 || !addr) return undefined;
  const family = isIP(addr);
  if (family !== 4 && family !== 6) return undefined;
  const max = family === 4 ? 32 : 128;
  if (prefix === undefined) return { kind: "cidr", family, addr, bits: max };
  if (!/^\d{1,3}$/.test(prefix) || Number(prefix) > max) return undefined;
  return { kind: "cidr", family, addr, bits: Number(prefix) };
}

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/** `example.com` or `*.example.com` (case-insensitive, trailing dot ignored), or undefined. */
export function parseDomainEntry(entry: string): DomainEntry | undefined {
  let name = entry.trim().toLowerCase();
  if (name.endsWith(".")) name = name.slice(0, -1);
  const wildcard = name.startsWith("*.");
  if (wildcard) name = name.slice(2);
  if (name.length === 0 || name.length > 253) return undefined;
  const labels = name.split(".");
  if (labels.length < 2 || !labels.every((label) => LABEL.test(label))) return undefined;
  if (/^\d+$/.test(labels[labels.length - 1] ?? "")) return undefined;
  return { kind: "domain", name, wildcard };
}

/**
 * Checks a policy and explains the first problem, in the words E2B's api uses where it has them. The api calls
 * this before anything is stored; the node compiles only policies that passed.
 */
export function validateEgressPolicy(policy: EgressPolicy, field = "network"): void {
  for (const entry of policy.denyOut) {
    if (typeof entry !== "string" || !parseAddressEntry(entry)) {
      throw new EgressPolicyError(`${field}.denyOut entry '${entry}' is not an IP address or CIDR`);
    }
  }
  let domains = 0;
  for (const entry of policy.allowOut) {
    if (typeof entry !== "string") throw new EgressPolicyError(`${field}.allowOut entries must be strings`);
    if (parseAddressEntry(entry)) continue;
    if (!parseDomainEntry(entry)) {
      throw new EgressPolicyError(
        `${field}.allowOut entry '${entry}' is not an IP address, CIDR, domain or wildcard domain (*.example.com)`,
      );
    }
    domains++;
  }
  if (domains > 0 && !policy.denyOut.includes(ALL_TRAFFIC)) {
    throw new EgressPolicyError(
      "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.",
    );
  }
}

/** A policy in the form enforcement needs. IPv4 only (sandboxes have no IPv6). */
export interface CompiledEgress {
  /** `a.b.c.d/n`, checked before `denyCidrs`. */
  readonly allowCidrs: readonly string[];
  readonly denyCidrs: readonly string[];
  readonly domains: readonly DomainEntry[];
  /** Whether an address matching no entry may be reached. */
  readonly defaultAllow: boolean;
  /** Whether the node's DNS forwarder answers this sandbox (for every name, or only permitted domains). */
  readonly dns: "all" | "domains" | "none";
  /** Stable text form: equal policies compile to equal keys (the driver skips re-applying them). */
  readonly key: string;
}

export function compileEgress(policy: EgressPolicy): CompiledEgress {
  validateEgressPolicy(policy);
  const cidrs = (entries: readonly string[]) =>
    [
      ...new Set(
        entries
          .map(parseAddressEntry)
          .filter((e): e is AddressEntry => e !== undefined && e.family === 4)
          .map((e) => `${e.addr}/${e.bits}`),
      ),
    ].sort();
  const allowCidrs = cidrs(policy.allowOut);
  const denyCidrs = cidrs(policy.denyOut);
  const domains = policy.allowOut
    .filter((entry) => !parseAddressEntry(entry))
    .map((entry) => parseDomainEntry(entry) as DomainEntry)
    .sort((a, b) => `${a.wildcard}${a.name}`.localeCompare(`${b.wildcard}${b.name}`));
  const defaultAllow = !denyCidrs.some((c) => c.endsWith("/0"));
  const dns = defaultAllow ? "all" : domains.length > 0 ? "domains" : "none";
  const key = JSON.stringify([
    allowCidrs,
    denyCidrs,
    domains.map((d) => (d.wildcard ? `*.${d.name}` : d.name)),
    defaultAllow,
  ]);
  return { allowCidrs, denyCidrs, domains, defaultAllow, dns, key };
}

/** Whether a DNS name (any case, trailing dot ignored) is one the policy's domain entries permit. */
export function domainPermitted(policy: CompiledEgress, name: string): boolean {
  let host = name.toLowerCase();
  if (host.endsWith(".")) host = host.slice(0, -1);
  return policy.domains.some((d) => (d.wildcard ? host.endsWith(`.${d.name}`) : host === d.name));
}

function blockListOf(cidrs: readonly string[]): BlockList {
  const list = new BlockList();
  for (const cidr of cidrs) {
    const [addr, bits] = cidr.split("/");
    list.addSubnet(addr as string, Number(bits), "ipv4");
  }
  return list;
}

const NEVER = blockListOf(NEVER_REACHABLE);
const PRIVATE = blockListOf(PRIVATE_RANGES);

/**
 * Whether the domain gateway may connect to `ip` on behalf of a sandbox whose permitted name resolved to it:
 * never the floor or the extra addresses given (the node's own, every sandbox network); private ranges only when
 * an allowOut CIDR names them. (A permitted name is the permission; denyOut CIDRs lose to allowOut, as in E2B.)
 */
export function resolvedAddressPermitted(policy: CompiledEgress, ip: string, forbidden: BlockList): boolean {
  if (isIP(ip) !== 4) return false;
  if (NEVER.check(ip, "ipv4") || forbidden.check(ip, "ipv4")) return false;
  if (PRIVATE.check(ip, "ipv4")) return blockListOf(policy.allowCidrs).check(ip, "ipv4");
  return true;
}

/**
 * A team's egress setting (Warren extra, set by an admin): `open` — sandboxes reach the internet unless they ask
 * otherwise (E2B's default); `closed` — nothing leaves unless the sandbox asks for `allow_internet_access: true`
 * or lists what it needs in `allowOut`; `forbidden` — nothing ever leaves, and asking for egress is refused.
 */
export type TeamEgressMode = "open" | "closed" | "forbidden";
export const TEAM_EGRESS_MODES: readonly TeamEgressMode[] = ["open", "closed", "forbidden"];

function listField(network: Readonly<Record<string, unknown>> | null, field: string): string[] {
  const value = network?.[field];
  return Array.isArray(value) ? value.filter((entry): entry is string => typeof entry === "string") : [];
}

/** Whether a request asks for any egress at all (a `forbidden` team's requests must not). */
export function asksForEgress(
  network: Readonly<Record<string, unknown>> | null,
  allowInternetAccess: boolean | null | undefined,
): boolean {
  return allowInternetAccess === true || listField(network, "allowOut").length > 0;
}

/**
 * The policy a sandbox gets from its request (E2B `network` + `allow_internet_access`) and its team's mode.
 * `allow_internet_access: false` is `denyOut: [ALL_TRAFFIC]` (E2B); a `closed` team adds it unless the request
 * opened something; a `forbidden` team gets nothing out.
 */
export function effectiveEgress(
  network: Readonly<Record<string, unknown>> | null,
  allowInternetAccess: boolean | null | undefined,
  mode: TeamEgressMode,
): EgressPolicy {
  if (mode === "forbidden") return CLOSED_EGRESS;
  const allowOut = listField(network, "allowOut");
  const denyOut = listField(network, "denyOut");
  const closeAll =
    allowInternetAccess === false ||
    (mode === "closed" && allowInternetAccess !== true) ||
    denyOut.includes(ALL_TRAFFIC);
  return { allowOut, denyOut: closeAll ? [...new Set([...denyOut, ALL_TRAFFIC])] : denyOut };
}
