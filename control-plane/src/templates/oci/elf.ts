import { open } from "node:fs/promises";

/**
 * What the dynamic loader needs to know about an ELF file, read from its program headers and dynamic segment
 * (section headers may be stripped): its interpreter, the libraries it needs, and the symbol versions it needs
 * from each (`GLIBC_2.28` from `libc.so.6`) or defines (a library's own versions). Reads only the headers and
 * the dynamic tables, so a 100 MB binary costs a few small reads.
 */
export interface ElfInfo {
  /** e_machine: 62 = x86-64, 183 = AArch64. */
  readonly machine: number;
  /** PT_INTERP, e.g. `/lib64/ld-linux-x86-64.so.2`; absent for static binaries and most libraries. */
  readonly interpreter?: string;
  readonly soname?: string;
  /** DT_NEEDED sonames. */
  readonly needed: readonly string[];
  /** Versions needed, by the soname that must define them. */
  readonly versionsNeeded: ReadonlyMap<string, readonly string[]>;
  /** Versions this object defines (a library's), its own soname entry excluded. */
  readonly versionsDefined: readonly string[];
}

const PT_LOAD = 1;
const PT_DYNAMIC = 2;
const PT_INTERP = 3;
const DT_NULL = 0n;
const DT_NEEDED = 1n;
const DT_STRTAB = 5n;
const DT_STRSZ = 10n;
const DT_SONAME = 14n;
const DT_VERDEF = 0x6ffffffcn;
const DT_VERDEFNUM = 0x6ffffffdn;
const DT_VERNEED = 0x6ffffffen;
const DT_VERNEEDNUM = 0x6fffffffn;
const VER_FLG_BASE = 1;
/** Guards against corrupt files: no real dynamic table or version list comes near these. */
const MAX_TABLE = 64 << 20;
const MAX_ENTRIES = 4096;

type Read = (offset: number, length: number) => Promise<Buffer>;

interface Segments {
  readonly machine: number;
  readonly interpreter?: string;
  readonly loads: readonly { vaddr: number; offset: number; size: number }[];
  readonly dynamic?: { offset: number; size: number };
}

interface DynamicTable {
  readonly tags: ReadonlyMap<bigint, readonly number[]>;
  /** A string of the dynamic string table. */
  readonly str: (index: number) => string;
  /** File offset of a virtual address. */
  readonly toOffset: (vaddr: number) => number;
}

/** The ELF facts of `path`, or undefined when it is not a 64-bit little-endian ELF file. */
export async function readElf(path: string): Promise<ElfInfo | undefined> {
  const file = await open(path, "r");
  try {
    const read: Read = async (offset, length) => {
      if (length < 0 || length > MAX_TABLE) throw new Error(`ELF table of ${length} bytes in ${path}`);
      const buffer = Buffer.alloc(length);
      const { bytesRead } = await file.read(buffer, 0, length, offset);
      if (bytesRead !== length) throw new Error(`${path} is truncated`);
      return buffer;
    };
    const segments = await readSegments(read);
    if (!segments) return undefined;
    const base = { machine: segments.machine, ...(segments.interpreter ? { interpreter: segments.interpreter } : {}) };
    const table = await readDynamic(read, segments, path);
    if (!table) return { ...base, needed: [], versionsNeeded: new Map(), versionsDefined: [] };
    const one = (tag: bigint) => table.tags.get(tag)?.[0];
    const soname = one(DT_SONAME);
    return {
      ...base,
      ...(soname !== undefined ? { soname: table.str(soname) } : {}),
      needed: (table.tags.get(DT_NEEDED) ?? []).map(table.str),
      versionsNeeded: await readVersionsNeeded(read, table, one(DT_VERNEED), one(DT_VERNEEDNUM) ?? 0),
      versionsDefined: await readVersionsDefined(read, table, one(DT_VERDEF), one(DT_VERDEFNUM) ?? 0),
    };
  } finally {
    await file.close();
  }
}

async function readSegments(read: Read): Promise<Segments | undefined> {
  const header = await read(0, 64).catch(() => undefined);
  // \x7fELF, ELFCLASS64, ELFDATA2LSB
  if (!header || header.readUInt32BE(0) !== 0x7f454c46 || header[4] !== 2 || header[5] !== 1) return undefined;
  const phoff = Number(header.readBigUInt64LE(32));
  const phentsize = header.readUInt16LE(54);
  const phnum = header.readUInt16LE(56);
  const phdrs = await read(phoff, phentsize * phnum);
  const loads: { vaddr: number; offset: number; size: number }[] = [];
  let interpreter: string | undefined;
  let dynamic: { offset: number; size: number } | undefined;
  for (let i = 0; i < phnum; i++) {
    const p = phdrs.subarray(i * phentsize, (i + 1) * phentsize);
    const type = p.readUInt32LE(0);
    const offset = Number(p.readBigUInt64LE(8));
    const size = Number(p.readBigUInt64LE(32));
    if (type === PT_LOAD) loads.push({ vaddr: Number(p.readBigUInt64LE(16)), offset, size });
    if (type === PT_DYNAMIC) dynamic = { offset, size };
    if (type === PT_INTERP) interpreter = (await read(offset, size)).toString("latin1").replace(/\0.*$/s, "");
  }
  return {
    machine: header.readUInt16LE(18),
    loads,
    ...(interpreter ? { interpreter } : {}),
    ...(dynamic ? { dynamic } : {}),
  };
}

async function readDynamic(read: Read, segments: Segments, path: string): Promise<DynamicTable | undefined> {
  if (!segments.dynamic) return undefined;
  const toOffset = (vaddr: number): number => {
    const load = segments.loads.find((l) => vaddr >= l.vaddr && vaddr < l.vaddr + l.size);
    if (!load) throw new Error(`address ${vaddr} of ${path} is in no loaded segment`);
    return vaddr - load.vaddr + load.offset;
  };
  const entries = await read(segments.dynamic.offset, segments.dynamic.size);
  const tags = new Map<bigint, number[]>();
  for (let at = 0; at + 16 <= entries.length; at += 16) {
    const tag = entries.readBigInt64LE(at);
    if (tag === DT_NULL) break;
    tags.set(tag, [...(tags.get(tag) ?? []), Number(entries.readBigUInt64LE(at + 8))]);
  }
  const strtab = tags.get(DT_STRTAB)?.[0];
  const strsz = tags.get(DT_STRSZ)?.[0];
  if (strtab === undefined || strsz === undefined) return undefined;
  const strings = await read(toOffset(strtab), strsz);
  const str = (index: number) => {
    const end = strings.indexOf(0, index);
    return strings.toString("latin1", index, end < 0 ? strings.length : end);
  };
  return { tags, str, toOffset };
}

/** Elf64_Verneed entries (one per library) and their Elf64_Vernaux (one per version). */
async function readVersionsNeeded(
  read: Read,
  table: DynamicTable,
  verneed: number | undefined,
  count: number,
): Promise<Map<string, string[]>> {
  const needed = new Map<string, string[]>();
  if (verneed === undefined) return needed;
  let at = table.toOffset(verneed);
  for (let n = 0; n < Math.min(count, MAX_ENTRIES); n++) {
    const entry = await read(at, 16);
    const versions: string[] = [];
    let aux = at + entry.readUInt32LE(8);
    for (let k = 0; k < Math.min(entry.readUInt16LE(2), MAX_ENTRIES); k++) {
      const vernaux = await read(aux, 16);
      versions.push(table.str(vernaux.readUInt32LE(8)));
      aux += vernaux.readUInt32LE(12);
    }
    needed.set(table.str(entry.readUInt32LE(4)), versions);
    const next = entry.readUInt32LE(12);
    if (next === 0) break;
    at += next;
  }
  return needed;
}

/** Elf64_Verdef entries; the first Elf64_Verdaux of each names the version (the VER_FLG_BASE one: the file). */
async function readVersionsDefined(
  read: Read,
  table: DynamicTable,
  verdef: number | undefined,
  count: number,
): Promise<string[]> {
  const defined: string[] = [];
  if (verdef === undefined) return defined;
  let at = table.toOffset(verdef);
  for (let n = 0; n < Math.min(count, MAX_ENTRIES); n++) {
    const entry = await read(at, 20);
    if (!(entry.readUInt16LE(2) & VER_FLG_BASE)) {
      const verdaux = await read(at + entry.readUInt32LE(12), 8);
      defined.push(table.str(verdaux.readUInt32LE(0)));
    }
    const next = entry.readUInt32LE(16);
    if (next === 0) break;
    at += next;
  }
  return defined;
}
