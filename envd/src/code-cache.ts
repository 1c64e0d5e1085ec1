import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import Module from "node:module";
import vm from "node:vm";

/** A code cache file: this header (codeCacheKey), then V8's data. */
const HEADER_BYTES = 32;

/** What a code cache was made for: the script's text and the Node.js (V8) that compiled it. */
export function codeCacheKey(source: string): Buffer {
  return createHash("sha256").update(`${process.version}\0${process.arch}\0`).update(source).digest();
}

/** The V8 data of a cache file, when it was made for exactly `key`; undefined for any other file, or none. */
export function readCodeCache(file: string, key: Buffer): Buffer | undefined {
  let data: Buffer;
  try {
    data = readFileSync(file);
  } catch {
    return undefined;
  }
  if (data.length <= HEADER_BYTES || !data.subarray(0, HEADER_BYTES).equals(key)) return undefined;
  return data.subarray(HEADER_BYTES);
}

/** A cache file's contents: the header, then what V8 made of `script` so far. */
export function codeCacheFile(key: Buffer, script: vm.Script): Buffer {
  return Buffer.concat([key, script.createCachedData()]);
}

export interface CompiledModule {
  readonly script: vm.Script;
  readonly key: Buffer;
  /** Whether V8 used the cache file (false also when there was none, or it was made for something else). */
  readonly fromCache: boolean;
}

/**
 * Compiles a CommonJS file in Node.js's module wrapper, with the code cache at `cacheFile` when it was made for
 * this file and this Node.js (V8 itself checks only the source's length). Any other cache is ignored, and V8
 * rejects data it cannot use: the file then compiles as usual.
 */
export function compileModule(file: string, cacheFile: string): CompiledModule {
  // A shebang is not JavaScript inside the wrapper.
  const source = readFileSync(file, "utf8").replace(/^#!.*/, "");
  const key = codeCacheKey(source);
  const cachedData = readCodeCache(cacheFile, key);
  const script = new vm.Script(Module.wrap(source), { filename: file, ...(cachedData ? { cachedData } : {}) });
  return { script, key, fromCache: cachedData !== undefined && !script.cachedDataRejected };
}
