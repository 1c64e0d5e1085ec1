import { readFileSync } from "node:fs";

/** A listening TCP socket of this network namespace. */
export interface TcpListener {
  readonly family: 4 | 6;
  /** Dotted IPv4 or compressed-enough IPv6 ("::1", "::", or eight hex groups). */
  readonly address: string;
  readonly port: number;
}

const LISTEN = "0A";

/**
 * The listening sockets of envd's network namespace, from /proc/net/tcp and /proc/net/tcp6 (the kernel's own
 * table: no `ss` in minimal templates). A missing tcp6 (IPv6 off) counts as empty. Read synchronously: the kernel
 * writes these tables into the read as it is made (nothing waits on a disk), and an asynchronous read took five
 * or more hops through libuv's thread pool per file, once a second in every sandbox — most of an idle envd's CPU.
 */
export async function readTcpListeners(procNet = "/proc/net"): Promise<TcpListener[]> {
  return [
    ...parseProcNetTcp(readProcTable(`${procNet}/tcp`), 4),
    ...parseProcNetTcp(readProcTable(`${procNet}/tcp6`), 6),
  ];
}

function readProcTable(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

/** Parses one /proc/net/tcp{,6} table: `sl local_address rem_address st ...`, addresses as hex `ADDR:PORT`. */
export function parseProcNetTcp(text: string, family: 4 | 6): TcpListener[] {
  const listeners: TcpListener[] = [];
  for (const line of text.split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields.length < 4 || fields[3] !== LISTEN) continue;
    const [hexAddress, hexPort] = (fields[1] ?? "").split(":");
    if (!hexAddress || !hexPort) continue;
    const address = family === 4 ? ipv4FromProc(hexAddress) : ipv6FromProc(hexAddress);
    if (address === undefined) continue;
    listeners.push({ family, address, port: Number.parseInt(hexPort, 16) });
  }
  return listeners;
}

/** The kernel prints each 32-bit word of an address in host byte order (little-endian here). */
function wordBytes(hex: string): number[] {
  const value = Number.parseInt(hex, 16);
  return [value & 0xff, (value >>> 8) & 0xff, (value >>> 16) & 0xff, (value >>> 24) & 0xff];
}

function ipv4FromProc(hex: string): string | undefined {
  if (!/^[0-9A-Fa-f]{8}$/.test(hex)) return undefined;
  return wordBytes(hex).join(".");
}

function ipv6FromProc(hex: string): string | undefined {
  if (!/^[0-9A-Fa-f]{32}$/.test(hex)) return undefined;
  const bytes = [0, 8, 16, 24].flatMap((at) => wordBytes(hex.slice(at, at + 8)));
  const groups = Array.from({ length: 8 }, (_, i) => ((bytes[2 * i]! << 8) | bytes[2 * i + 1]!).toString(16));
  const text = groups.join(":");
  if (text === "0:0:0:0:0:0:0:0") return "::";
  if (text === "0:0:0:0:0:0:0:1") return "::1";
  return text;
}

/** 127.0.0.0/8, ::1, and IPv4-mapped loopback. */
export function isLoopback(address: string): boolean {
  return address.startsWith("127.") || address === "::1" || /^0:0:0:0:0:ffff:7f/.test(address);
}

export function isWildcard(address: string): boolean {
  return address === "0.0.0.0" || address === "::";
}
