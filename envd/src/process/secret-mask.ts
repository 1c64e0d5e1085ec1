import { invalidArgument } from "../errors.js";
import type { OutputStream } from "./output-buffer.js";

/** Header (proxy → envd only): base64 of the JSON env var name → secret value, for this one Start. */
export const SECRET_ENV_HEADER = "warren-secret-env";
const MASK = Buffer.from("***");

/**
 * The secrets of one Start request, from the header the proxy sets after redeeming a grant. They become env vars of
 * that process only: never stored in the sandbox state, the process's reported config, or a log line.
 */
export function secretEnvFromHeader(header: string | null): Record<string, string> {
  if (header === null || header === "") return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(header, "base64").toString("utf8"));
  } catch {
    throw invalidArgument(`${SECRET_ENV_HEADER} must be base64 of a JSON object`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw invalidArgument(`${SECRET_ENV_HEADER} must be base64 of a JSON object`);
  }
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(parsed as Record<string, unknown>)) {
    if (typeof value !== "string" || name === "" || name.includes("=") || name.includes("\0") || value.includes("\0")) {
      throw invalidArgument(`${SECRET_ENV_HEADER} entry '${name.replaceAll("\0", "\\0")}' is not a usable env var`);
    }
    env[name] = value;
  }
  return env;
}

/**
 * Replaces every occurrence of the secret values in one output stream with `***`. A value split across two reads is
 * still found: the longest tail that could begin a value is held back until the next read or the end.
 */
export class SecretMask {
  private readonly needles: Buffer[];
  private readonly held = new Map<OutputStream, Buffer>();

  constructor(values: readonly string[]) {
    // Longest first, so a value containing another is masked whole.
    this.needles = [...new Set(values)]
      .filter((v) => v.length > 0)
      .map((v) => Buffer.from(v, "utf8"))
      .sort((a, b) => b.length - a.length);
  }

  get active(): boolean {
    return this.needles.length > 0;
  }

  /** The masked bytes safe to emit now for `stream`. */
  apply(stream: OutputStream, data: Buffer): Buffer {
    const pending = this.held.get(stream);
    const input = pending ? Buffer.concat([pending, data]) : data;
    const { out, rest } = this.scan(input);
    if (rest.length > 0) this.held.set(stream, rest);
    else this.held.delete(stream);
    return out;
  }

  /** What is still held back for `stream` (the process ended: nothing more can complete a value). */
  flush(stream: OutputStream): Buffer {
    const pending = this.held.get(stream) ?? Buffer.alloc(0);
    this.held.delete(stream);
    return pending;
  }

  streams(): OutputStream[] {
    return [...this.held.keys()];
  }

  private scan(input: Buffer): { out: Buffer; rest: Buffer } {
    const parts: Buffer[] = [];
    let from = 0;
    let i = 0;
    while (i < input.length) {
      const hit = this.needles.find((n) => input[i] === n[0] && input.subarray(i, i + n.length).equals(n));
      if (hit) {
        parts.push(input.subarray(from, i), MASK);
        i += hit.length;
        from = i;
        continue;
      }
      i += 1;
    }
    // Hold back the longest tail that is a proper prefix of some value.
    let keep = 0;
    for (const n of this.needles) {
      for (let len = Math.min(n.length - 1, input.length - from); len > keep; len--) {
        if (input.subarray(input.length - len).equals(n.subarray(0, len))) {
          keep = len;
          break;
        }
      }
    }
    parts.push(input.subarray(from, input.length - keep));
    return { out: Buffer.concat(parts), rest: Buffer.from(input.subarray(input.length - keep)) };
  }
}
