import { createReadStream, createWriteStream, lstatSync, readlinkSync, type Stats, statSync } from "node:fs";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createGzip } from "node:zlib";
import { type ContextEntry, contextEntries, followsLink } from "./context-files.js";

/**
 * The upload archive of a COPY step (E2B-TEMPLATES.md §4.3): a ustar archive, gzip-compressed by default, of
 * exactly the entries `filesHash` covers, named relative to the context directory, with their modes, owners and
 * mtimes; directories as directory entries (not recursed: their contents are entries of their own), symlinks as
 * links unless `resolveSymlinks` (then the file or directory they point to). Paths or link targets too long for
 * ustar fields get a PAX extended header; numbers too large for octal fields use the base-256 form.
 */

const BLOCK = 512;

/** An archive spooled to a temporary file, so an upload can send an exact Content-Length. */
export interface SpooledArchive {
  readonly path: string;
  readonly size: number;
  /** Removes the temporary file; never throws. */
  cleanup(): Promise<void>;
}

export interface ArchiveOptions {
  readonly resolveSymlinks: boolean;
  readonly gzip: boolean;
}

export async function spoolArchive(
  src: string,
  contextPath: string,
  ignorePatterns: readonly string[],
  opts: ArchiveOptions,
): Promise<SpooledArchive> {
  const entries = contextEntries(src, contextPath, ignorePatterns);
  const dir = await mkdtemp(join(tmpdir(), "warren-template-"));
  const path = join(dir, opts.gzip ? "context.tar.gz" : "context.tar");
  const cleanup = () => rm(dir, { recursive: true, force: true }).catch(() => undefined);
  try {
    const tar = Readable.from(tarStream(entries, opts.resolveSymlinks));
    if (opts.gzip) await pipeline(tar, createGzip(), createWriteStream(path));
    else await pipeline(tar, createWriteStream(path));
    return { path, size: (await stat(path)).size, cleanup };
  } catch (error) {
    await cleanup();
    throw error;
  }
}

/** The tar bytes of `entries`, member by member. */
export async function* tarStream(entries: readonly ContextEntry[], resolveSymlinks: boolean): AsyncGenerator<Buffer> {
  for (const entry of entries) {
    const asLink = entry.isSymbolicLink && !followsLink(entry, resolveSymlinks);
    const st = asLink ? lstatSync(entry.fullpath) : statSync(entry.fullpath);
    const name = entry.relativePath === "" ? "./" : entry.relativePath;
    if (asLink) {
      yield* headerBlocks(name, st, "2", 0, readlinkSync(entry.fullpath));
    } else if (st.isDirectory()) {
      yield* headerBlocks(name.endsWith("/") ? name : `${name}/`, st, "5", 0, "");
    } else if (st.isFile()) {
      yield* headerBlocks(name, st, "0", st.size, "");
      yield* fileBlocks(entry.fullpath, st.size);
    }
    // Sockets, FIFOs and devices have no content to copy; tar implementations skip them too.
  }
  yield Buffer.alloc(BLOCK * 2);
}

/** Exactly `size` bytes of the file (zero-filled if it shrank since its stat), padded to a block. */
async function* fileBlocks(path: string, size: number): AsyncGenerator<Buffer> {
  let sent = 0;
  if (size > 0) {
    for await (const chunk of createReadStream(path, { end: size - 1 }) as AsyncIterable<Buffer>) {
      sent += chunk.length;
      yield chunk;
    }
  }
  if (sent < size) yield Buffer.alloc(size - sent);
  const pad = (BLOCK - (size % BLOCK)) % BLOCK;
  if (pad > 0) yield Buffer.alloc(pad);
}

function* headerBlocks(name: string, st: Stats, type: string, size: number, linkname: string): Generator<Buffer> {
  const pax: Record<string, string> = {};
  const split = splitName(name);
  if (!split) pax.path = name;
  if (Buffer.byteLength(linkname) > 100) pax.linkpath = linkname;
  if (Object.keys(pax).length > 0) {
    const body = paxRecords(pax);
    const paxName = `PaxHeader/${Buffer.from(name).subarray(0, 80).toString()}`;
    yield header({ name: paxName, prefix: "", mode: 0o644, uid: st.uid, gid: st.gid, size: body.length }, st, "x", "");
    yield body;
    const pad = (BLOCK - (body.length % BLOCK)) % BLOCK;
    if (pad > 0) yield Buffer.alloc(pad);
  }
  const fields = split ?? { name: truncate(name, 100), prefix: "" };
  yield header(
    { ...fields, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid, size },
    st,
    type,
    truncate(linkname, 100),
  );
}

/** ustar's name (≤ 100 bytes) + prefix (≤ 155 bytes, split at a `/`), or undefined when it does not fit. */
function splitName(name: string): { name: string; prefix: string } | undefined {
  if (Buffer.byteLength(name) <= 100) return { name, prefix: "" };
  for (let i = name.indexOf("/"); i !== -1; i = name.indexOf("/", i + 1)) {
    const prefix = name.slice(0, i);
    const rest = name.slice(i + 1);
    if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(rest) <= 100 && rest !== "")
      return { name: rest, prefix };
  }
  return undefined;
}

function truncate(s: string, bytes: number): string {
  const b = Buffer.from(s);
  return b.length <= bytes ? s : b.subarray(0, bytes).toString();
}

/** PAX records `<len> <key>=<value>\n`, where `<len>` counts the whole record including itself. */
function paxRecords(records: Record<string, string>): Buffer {
  const parts = Object.entries(records).map(([key, value]) => {
    const body = ` ${key}=${value}\n`;
    const bodyLength = Buffer.byteLength(body);
    let length = bodyLength + 1;
    while (String(length).length + bodyLength !== length) length++;
    return Buffer.from(`${length}${body}`);
  });
  return Buffer.concat(parts);
}

interface HeaderFields {
  name: string;
  prefix: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
}

function header(f: HeaderFields, st: Stats, type: string, linkname: string): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(f.name, 0, 100, "utf8");
  writeNumber(h, 100, 8, f.mode);
  writeNumber(h, 108, 8, f.uid);
  writeNumber(h, 116, 8, f.gid);
  writeNumber(h, 124, 12, f.size);
  writeNumber(h, 136, 12, Math.floor(st.mtimeMs / 1000));
  h.write("        ", 148, 8, "ascii");
  h.write(type, 156, 1, "ascii");
  h.write(linkname, 157, 100, "utf8");
  h.write("ustar\u000000", 257, 8, "binary");
  h.write(f.prefix, 345, 155, "utf8");
  let sum = 0;
  for (const byte of h) sum += byte;
  h.write(`${sum.toString(8).padStart(6, "0")}\u0000 `, 148, 8, "ascii");
  return h;
}

/** An octal field (NUL-terminated), or the base-256 form when the value does not fit. */
function writeNumber(h: Buffer, offset: number, length: number, value: number): void {
  const octal = Math.max(0, Math.floor(value)).toString(8);
  if (octal.length <= length - 1) {
    h.write(`${octal.padStart(length - 1, "0")}\u0000`, offset, length, "ascii");
    return;
  }
  let n = BigInt(Math.floor(value));
  h[offset] = 0x80;
  for (let i = offset + length - 1; i > offset; i--) {
    h[i] = Number(n & 0xffn);
    n >>= 8n;
  }
}
