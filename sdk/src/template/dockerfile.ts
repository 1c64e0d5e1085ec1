import { existsSync, readFileSync, statSync } from "node:fs";
import { type ReadyCmd, waitForTimeout } from "./ready-cmd.js";

/**
 * `fromDockerfile`: a Dockerfile translated into builder calls, as E2B's SDK does it with `dockerfile-ast`
 * (E2B-TEMPLATES.md §3.4). The tokenizer below follows dockerfile-ast's rules so the steps come out the same:
 * instructions end at an unescaped newline; the escape character (`\`, or `` ` `` by a `# escape=` directive)
 * before a newline continues the line; comment lines and blank lines inside a continuation are skipped;
 * arguments split on whitespace with quotes kept as typed; an escape before any other character is dropped
 * (but `\$` is kept); leading `--flag[=value]` arguments of FROM/RUN/COPY/ADD are flags; heredoc bodies
 * (`RUN <<EOF`) are skipped.
 */

/** The builder calls a Dockerfile turns into. */
export interface DockerfileTarget {
  setUser(user: string): unknown;
  setWorkdir(workdir: string): unknown;
  setEnvs(envs: Record<string, string>): unknown;
  runCmd(command: string): unknown;
  copy(src: string, dest: string, options?: { user?: string }): unknown;
  setStartCmd(startCommand: string, readyCommand: ReadyCmd): unknown;
}

export interface DockerInstruction {
  /** Upper-cased keyword (`RUN`, `COPY`, ...). */
  readonly keyword: string;
  /** Arguments after the flags, as dockerfile-ast's `getArguments()` values. */
  readonly args: string[];
  readonly flags: { name: string; value: string | null }[];
}

/** The Dockerfile at `contentOrPath` if that names a file, else `contentOrPath` itself as Dockerfile text. */
export function readDockerfile(contentOrPath: string): string {
  try {
    if (existsSync(contentOrPath) && statSync(contentOrPath).isFile()) return readFileSync(contentOrPath, "utf8");
  } catch {
    // not a readable path: it is the content
  }
  return contentOrPath;
}

/**
 * Applies a Dockerfile to `target` and returns its base image. Exactly one FROM; the user and workdir start as
 * Docker's (`root`, `/`) and, when the Dockerfile sets none, end as E2B's (`user`, `/home/user`). CMD or
 * ENTRYPOINT become the start command with a 20 s ready wait; EXPOSE and VOLUME are skipped; other instructions
 * are reported through `warn` and skipped.
 */
export function applyDockerfile(
  contentOrPath: string,
  target: DockerfileTarget,
  warn: (message: string) => void = console.warn,
): string {
  const instructions = parseDockerfile(readDockerfile(contentOrPath));
  const froms = instructions.filter((i) => i.keyword === "FROM");
  if (froms.length > 1) throw new Error("Multi-stage Dockerfiles are not supported");
  const from = froms[0];
  if (!from) throw new Error("Dockerfile must contain a FROM instruction");
  const baseImage = from.args[0] ?? "e2bdev/base";

  let userChanged = false;
  let workdirChanged = false;
  target.setUser("root");
  target.setWorkdir("/");
  for (const instruction of instructions) {
    const { keyword, args } = instruction;
    switch (keyword) {
      case "FROM":
      case "EXPOSE":
      case "VOLUME":
        break;
      case "RUN":
        if (args.length > 0) target.runCmd(args.join(" "));
        break;
      case "COPY":
      case "ADD":
        applyCopy(instruction, target);
        break;
      case "WORKDIR":
        if (args[0] !== undefined) target.setWorkdir(args[0]);
        workdirChanged = true;
        break;
      case "USER":
        if (args[0] !== undefined) target.setUser(args[0]);
        userChanged = true;
        break;
      case "ENV":
      case "ARG": {
        const envs = envsOf(keyword, args);
        if (Object.keys(envs).length > 0) target.setEnvs(envs);
        break;
      }
      case "CMD":
      case "ENTRYPOINT":
        if (args.length > 0) target.setStartCmd(startCommandOf(args), waitForTimeout(20_000));
        break;
      default:
        warn(`Unsupported instruction: ${keyword}`);
    }
  }
  if (!userChanged) target.setUser("user");
  if (!workdirChanged) target.setWorkdir("/home/user");
  return baseImage;
}

function applyCopy({ args, flags }: DockerInstruction, target: DockerfileTarget): void {
  if (args.length < 2) return;
  const dest = args[args.length - 1] as string;
  const chown = flags.find((f) => f.name === "chown");
  const user = chown ? (chown.value ?? undefined) : undefined;
  for (const src of args.slice(0, -1)) target.copy(src, dest, { user });
}

/** `ENV K=V K2=V2`, `ENV K V`, `ARG K[=default]` → the variables (an ARG without default is ""). */
function envsOf(keyword: string, args: string[]): Record<string, string> {
  const envs: Record<string, string> = {};
  const pair = (s: string): [string, string] | undefined => {
    const eq = s.indexOf("=");
    return eq > 0 ? [s.slice(0, eq), s.slice(eq + 1)] : undefined;
  };
  if (args.length === 2) {
    const [first, second] = args as [string, string];
    if (first.includes("=") && second.includes("=")) {
      for (const arg of args) {
        const kv = pair(arg);
        if (kv) envs[kv[0]] = kv[1];
      }
    } else {
      envs[first] = second;
    }
  } else if (args.length === 1) {
    const only = args[0] as string;
    const kv = pair(only);
    if (kv) envs[kv[0]] = kv[1];
    else if (keyword === "ARG" && only.trim()) envs[only.trim()] = "";
  } else {
    for (const arg of args) {
      const kv = pair(arg);
      if (kv) envs[kv[0]] = kv[1];
      else if (keyword === "ARG") envs[arg] = "";
    }
  }
  return envs;
}

/** The arguments joined by spaces; a JSON array (exec form) is joined element by element. */
function startCommandOf(args: string[]): string {
  const command = args.join(" ");
  try {
    const parsed: unknown = JSON.parse(command);
    if (Array.isArray(parsed)) return parsed.join(" ");
  } catch {
    // shell form
  }
  return command;
}

// ---------------------------------------------------------------------------------------------------------------
// Tokenizer (dockerfile-ast's Parser and Instruction.getRawArguments).

const isNewline = (c: string) => c === "\r" || c === "\n";
const isWhitespace = (c: string) => c === " " || c === "\t" || isNewline(c);
/** Instructions whose leading `--name[=value]` arguments are flags. */
const FLAGGED = new Set(["FROM", "RUN", "COPY", "ADD"]);
const HEREDOC_KEYWORDS = new Set(["ADD", "COPY", "RUN"]);

export function parseDockerfile(text: string): DockerInstruction[] {
  return new DockerfileTokenizer(text).instructions();
}

class DockerfileTokenizer {
  private escapeChar = "\\";
  private readonly out: DockerInstruction[] = [];

  constructor(private readonly buffer: string) {}

  instructions(): DockerInstruction[] {
    const { count, escapeChar } = this.directives();
    this.escapeChar = escapeChar;
    let offset = 0;
    if (count > 0) {
      offset = this.lineStart(count);
    } else if (this.buffer.charCodeAt(0) === 0xfeff) {
      offset = 1;
    }
    for (let i = offset; i < this.buffer.length; i++) {
      const c = this.buffer.charAt(i);
      if (isWhitespace(c)) continue;
      i = c === "#" ? this.skipComment(i) : this.instruction(c, i);
    }
    return this.out;
  }

  /** Parser directives (`# escape=\``) at the top: how many lines they take and the escape character. */
  private directives(): { count: number; escapeChar: string } {
    let count = 0;
    let escapeChar = "\\";
    const lines = this.buffer.replace(/^\uFEFF/, "").split(/\r?\n/);
    for (const line of lines) {
      const m = /^[ \t]*#[ \t]*([^ \t=]+)[^=]*=[ \t]*([^ \t]*)/.exec(line);
      if (!m || /^[ \t]*#[ \t]*=/.test(line)) break;
      count++;
      if (m[1]?.toLowerCase() === "escape" && (m[2] === "\\" || m[2] === "`")) escapeChar = m[2];
    }
    return { count, escapeChar };
  }

  private lineStart(line: number): number {
    let offset = 0;
    for (let n = 0; n < line; n++) {
      const next = this.buffer.indexOf("\n", offset);
      if (next === -1) return this.buffer.length;
      offset = next + 1;
    }
    return offset;
  }

  private skipComment(start: number): number {
    for (let i = start + 1; i < this.buffer.length; i++) if (isNewline(this.buffer.charAt(i))) return i;
    return this.buffer.length;
  }

  /** One instruction from `start`; returns the offset where it ends. */
  private instruction(first: string, start: number): number {
    const buf = this.buffer;
    let keyword = first;
    let keywordEnd = -1;
    let escaped = false;
    scan: for (let i = start + 1; i < buf.length; i++) {
      let c = buf.charAt(i);
      switch (c) {
        case this.escapeChar: {
          escaped = true;
          c = buf.charAt(i + 1);
          if (isNewline(c)) {
            if (keywordEnd === -1) keywordEnd = i;
            i++;
          } else if (c === " " || c === "\t") {
            for (let j = i + 2; j < buf.length; j++) {
              const d = buf.charAt(j);
              if (d === " " || d === "\t") continue;
              if (isNewline(d)) {
                i = j;
                continue scan;
              }
              keywordEnd = i + 1;
              keyword += this.escapeChar;
              i = j - 2;
              continue scan;
            }
            keywordEnd = i + 1;
            keyword += this.escapeChar;
            break scan;
          } else {
            keywordEnd = i + 1;
            keyword += this.escapeChar;
            escaped = false;
          }
          break;
        }
        case " ":
        case "\t": {
          if (escaped) {
            let onlyWhitespace = false;
            for (let j = i + 1; j < buf.length; j++) {
              const d = buf.charAt(j);
              if (d === " " || d === "\t") continue;
              if (isNewline(d)) {
                i = j;
                onlyWhitespace = true;
              }
              break;
            }
            if (onlyWhitespace) continue scan;
            escaped = false;
          }
          if (keywordEnd === -1) keywordEnd = i;
          return this.add(keyword, keywordEnd, this.argumentsEnd(i), true);
        }
        case "\r":
        case "\n":
          if (escaped) continue;
          if (keywordEnd === -1) keywordEnd = i;
          this.add(keyword, i, i);
          return i;
        case "#":
          if (escaped) continue;
          keywordEnd = i + 1;
          keyword += c;
          escaped = false;
          break;
        default:
          keywordEnd = i + 1;
          keyword += c;
          escaped = false;
      }
    }
    if (keywordEnd === -1) keywordEnd = buf.length;
    this.add(keyword, keywordEnd, buf.length);
    return buf.length;
  }

  /** Where an instruction's arguments end (an unescaped newline), from the whitespace after its keyword. */
  private argumentsEnd(offset: number): number {
    const buf = this.buffer;
    let escaped = false;
    scan: for (let i = offset + 1; i < buf.length; i++) {
      const c = buf.charAt(i);
      if (isNewline(c)) {
        if (escaped) continue;
        return i;
      }
      if (c === this.escapeChar) {
        const next = buf.charAt(i + 1);
        if (isNewline(next)) {
          escaped = true;
          i++;
        } else if (next === " " || next === "\t") {
          for (let j = i + 2; j < buf.length; j++) {
            const d = buf.charAt(j);
            if (d === " " || d === "\t") continue;
            if (isNewline(d)) escaped = true;
            i = j;
            continue scan;
          }
          return buf.length;
        }
        continue;
      }
      if (c === "#") {
        if (escaped) i = this.skipComment(i);
        continue;
      }
      if (c !== " " && c !== "\t") escaped = false;
    }
    return buf.length;
  }

  /**
   * Records an instruction and returns where parsing resumes. A RUN/COPY/ADD with heredocs ends after their
   * bodies, and (as in dockerfile-ast) the bodies' words become arguments.
   */
  private add(keywordText: string, argsStart: number, end: number, heredocs = false): number {
    const keyword = keywordText.toUpperCase();
    let last = end;
    if (heredocs && HEREDOC_KEYWORDS.has(keyword)) {
      let tabbed = false;
      for (const arg of withoutFlags(keyword, rawArguments(this.buffer.slice(argsStart, end), this.escapeChar)).args) {
        if (!arg.startsWith("<<") || arg.length <= 2) continue;
        if (arg.startsWith("<<-")) tabbed = true;
        const name = heredocName(arg);
        if (name !== null) last = this.skipHeredoc(name, last, tabbed);
      }
    }
    this.out.push({
      keyword,
      ...withoutFlags(keyword, rawArguments(this.buffer.slice(argsStart, last), this.escapeChar)),
    });
    return last;
  }

  private skipHeredoc(name: string, offset: number, tabbed: boolean): number {
    const buf = this.buffer;
    let startWord = -1;
    let lineStart = true;
    for (let i = offset; i < buf.length; i++) {
      const c = buf.charAt(i);
      if (c === " ") {
        lineStart = false;
      } else if (c === "\t") {
        if (!tabbed) lineStart = false;
      } else if (isNewline(c)) {
        if (startWord !== -1 && name === buf.substring(startWord, i)) return i;
        startWord = -1;
        lineStart = true;
      } else if (lineStart) {
        startWord = i;
        lineStart = false;
      }
    }
    return buf.length;
  }
}

/** Leading `--name[=value]` arguments of FROM/RUN/COPY/ADD are flags, up to the first without `--`. */
function withoutFlags(keyword: string, raw: string[]): Pick<DockerInstruction, "args" | "flags"> {
  const flags: { name: string; value: string | null }[] = [];
  if (FLAGGED.has(keyword)) {
    for (const value of raw) {
      if (!value.includes("--")) break;
      if (!value.startsWith("--")) continue;
      const eq = value.indexOf("=");
      flags.push(
        eq === -1 ? { name: value.slice(2), value: null } : { name: value.slice(2, eq), value: value.slice(eq + 1) },
      );
    }
  }
  return { args: raw.slice(flags.length), flags };
}

function heredocName(arg: string): string | null {
  let value = arg.slice(2);
  if (value.startsWith("-")) value = value.slice(1);
  for (const quote of ['"', "'"]) {
    if (value.startsWith(quote)) {
      if (!value.endsWith(quote)) return null;
      value = value.slice(1, -1);
    }
  }
  return value.startsWith("<") ? null : value;
}

/** dockerfile-ast's `getRawArguments()`: the argument values of one instruction's text after its keyword. */
function rawArguments(fullArgs: string, escapeChar: string): string[] {
  const args: string[] = [];
  let start = false;
  let comment = false;
  let found = -1;
  let escapedWhitespaceDetected = false;
  let escaping = false;
  let escapeMarker = -1;
  let arg = "";
  const push = () => {
    args.push(arg);
    arg = "";
    found = -1;
  };
  for (let i = 0; i < fullArgs.length; i++) {
    const c = fullArgs.charAt(i);
    if (isWhitespace(c)) {
      if (escaping) {
        escapedWhitespaceDetected = true;
        if (isNewline(c)) {
          escapedWhitespaceDetected = false;
          if (comment) {
            comment = false;
            start = true;
          }
        }
        continue;
      }
      if (found !== -1) {
        push();
        escapeMarker = -1;
      }
    } else if (c === escapeChar) {
      const next = fullArgs.charAt(i + 1);
      if (next === " " || next === "\t") {
        for (let j = i + 2; j < fullArgs.length; j++) {
          const d = fullArgs.charAt(j);
          if (d === " " || d === "\t") continue;
          if (isNewline(d)) {
            comment = false;
            escaping = true;
            start = true;
            if (found !== -1) escapeMarker = i;
            i = d === "\r" ? j + 1 : j;
          } else {
            escapeMarker = i;
            if (found === -1) i = j - 1;
          }
          break;
        }
      } else if (next === "\r" || next === "\n") {
        comment = false;
        escaping = true;
        start = true;
        if (found !== -1 && escapeMarker === -1) escapeMarker = i;
        i += next === "\r" ? 2 : 1;
      } else {
        if (escapedWhitespaceDetected && escapeMarker !== -1) push();
        escapeMarker = -1;
        escapedWhitespaceDetected = false;
        escaping = false;
        if (next === "$") arg += c + next;
        else if (next === "") break;
        else arg += next;
        if (found === -1) found = i;
        i++;
      }
    } else if (!comment) {
      if (start && c === "#") {
        comment = true;
      } else {
        if (escapedWhitespaceDetected && escapeMarker !== -1) push();
        escapedWhitespaceDetected = false;
        escaping = false;
        escapeMarker = -1;
        arg += c;
        if (found === -1) found = i;
      }
      start = false;
    }
  }
  if (found !== -1) args.push(arg);
  return args;
}
