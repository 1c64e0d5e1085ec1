/**
 * IPv4 arithmetic for sandbox networks, shared by the runtime drivers: a node's CIDR is carved into one /30 per
 * sandbox (host side .1, sandbox .2), with static MAC addresses derived from the IPs.
 */

export function parseCidr(cidr: string): { base: number; slots: number } {
  const match = /^(\d+)\.(\d+)\.(\d+)\.(\d+)\/(\d+)$/.exec(cidr);
  if (!match) throw new Error(`invalid CIDR '${cidr}'`);
  const octets = match.slice(1, 5).map(Number);
  const bits = Number(match[5]);
  if (octets.some((o) => o > 255) || bits < 8 || bits > 28) throw new Error(`invalid CIDR '${cidr}' (prefix 8..28)`);
  const base = ((octets[0]! << 24) | (octets[1]! << 16) | (octets[2]! << 8) | octets[3]!) >>> 0;
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  return { base: (base & mask) >>> 0, slots: 2 ** (32 - bits) / 4 };
}

export function ipString(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

export function mac(prefix: number, ip: number): string {
  return [2, prefix, ip >>> 24, (ip >>> 16) & 255, (ip >>> 8) & 255, ip & 255]
    .map((b) => b.toString(16).padStart(2, "0"))
    .join(":");
}
