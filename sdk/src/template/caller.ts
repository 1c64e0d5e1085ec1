import { dirname, isAbsolute, relative } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The user's call site: the first stack frame outside this directory (the template module). It gives a
 * builder's default context directory (the directory of the file that called `Template()`) and the stack a
 * BuildError points at (the builder call that recorded the failing step), as E2B's SDK does.
 */

const OWN_DIR = dirname(fileURLToPath(import.meta.url));

interface Frame {
  readonly line: string;
  readonly file: string | undefined;
}

function frameFile(line: string): string | undefined {
  const m = /\(?((?:file:\/\/|\/|[A-Za-z]:\\)[^()]*?):\d+:\d+\)?\s*$/.exec(line);
  if (!m?.[1]) return undefined;
  try {
    return m[1].startsWith("file:") ? fileURLToPath(m[1]) : m[1];
  } catch {
    return undefined;
  }
}

function isUserFile(file: string): boolean {
  const rel = relative(OWN_DIR, dirname(file));
  return rel !== "" && (rel.startsWith("..") || isAbsolute(rel));
}

function userFrames(): Frame[] {
  const stack = new Error().stack ?? "";
  const frames = stack
    .split("\n")
    .slice(1)
    .map((line) => ({ line, file: frameFile(line) }));
  const first = frames.findIndex((f) => f.file !== undefined && isUserFile(f.file));
  return first === -1 ? [] : frames.slice(first);
}

/** The stack from the user's call on, or undefined when none is identifiable. */
export function callerFrame(): string | undefined {
  const frames = userFrames();
  return frames.length === 0 ? undefined : frames.map((f) => f.line).join("\n");
}

/** The directory of the file that called into the template module. */
export function callerDirectory(): string | undefined {
  const file = userFrames()[0]?.file;
  return file === undefined ? undefined : dirname(file);
}
