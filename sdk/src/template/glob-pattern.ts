import { braceExpand } from "./brace-expand.js";

/**
 * Glob patterns with the semantics E2B's file selection has (npm `glob` 13 over `minimatch` 10, always with
 * `dot: true`, `nocomment`, `nonegate` and optimization level 2): brace expansion, `*`, `?`, `[...]` classes,
 * `**`, extglobs, and the same pattern rewriting before a walk. `filesHash` depends on which files a COPY
 * selects, so this has to agree with E2B's selection exactly.
 */

export const GLOBSTAR: unique symbol = Symbol("globstar");
/** One path portion of a pattern: a literal name, a regular expression, or `**`. */
export type Segment = string | RegExp | typeof GLOBSTAR;

/** One brace-expanded alternative of a pattern: its compiled segments and the glob text of each. */
export interface PatternParts {
  readonly segments: Segment[];
  readonly globParts: string[];
}

/** Compiles a pattern into its alternatives, as minimatch's `set` and `globParts`. */
export function compilePattern(pattern: string): PatternParts[] {
  if (pattern === "") return [];
  const expanded = [...new Set(braceExpand(pattern))];
  const globParts = secondPhase(firstPhase(expanded.map((p) => p.split(/\/+/))));
  return globParts
    .map((parts) => ({ segments: parts.map(parseSegment), globParts: parts }))
    .filter((p) => p.segments.length > 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Rewriting the split pattern before a walk (minimatch's optimization level 2).

function firstPhase(globParts: string[][]): string[][] {
  let didSomething: boolean;
  do {
    didSomething = false;
    for (const parts of globParts) {
      for (let gs = parts.indexOf("**"); gs !== -1; gs = parts.indexOf("**", gs + 1)) {
        let gss = gs;
        while (parts[gss + 1] === "**") gss++;
        if (gss > gs) parts.splice(gs + 1, gss - gs);
        const next = parts[gs + 1];
        const p = parts[gs + 2];
        const p2 = parts[gs + 3];
        if (next !== "..") continue;
        if (!p || p === "." || p === ".." || !p2 || p2 === "." || p2 === "..") continue;
        didSomething = true;
        parts.splice(gs, 1);
        const other = parts.slice(0);
        other[gs] = "**";
        globParts.push(other);
        gs--;
      }
      if (dropDotPortions(parts)) didSomething = true;
      for (let dd = parts.indexOf("..", 1); dd !== -1; dd = parts.indexOf("..", dd + 1)) {
        const p = parts[dd - 1];
        if (p && p !== "." && p !== ".." && p !== "**") {
          didSomething = true;
          const needDot = dd === 1 && parts[dd + 1] === "**";
          parts.splice(dd - 1, 2, ...(needDot ? ["."] : []));
          if (parts.length === 0) parts.push("");
          dd -= 2;
        }
      }
    }
  } while (didSomething);
  return globParts;
}

/**
 * Removes `.` and empty portions inside a split path or pattern (keeping a leading `//`), and a lone trailing one
 * after a leading `.` — the step minimatch's pattern rewriting and its path matching share. True when it changed
 * something.
 */
export function dropDotPortions(parts: string[]): boolean {
  let changed = false;
  for (let i = 1; i < parts.length - 1; i++) {
    const p = parts[i];
    if (i === 1 && p === "" && parts[0] === "") continue;
    if (p === "." || p === "") {
      changed = true;
      parts.splice(i, 1);
      i--;
    }
  }
  if (parts[0] === "." && parts.length === 2 && (parts[1] === "." || parts[1] === "")) {
    changed = true;
    parts.pop();
  }
  return changed;
}

function secondPhase(globParts: string[][]): string[][] {
  for (let i = 0; i < globParts.length - 1; i++) {
    for (let j = i + 1; j < globParts.length; j++) {
      const matched = partsMatch(globParts[i] ?? [], globParts[j] ?? []);
      if (matched) {
        globParts[i] = [];
        globParts[j] = matched;
        break;
      }
    }
  }
  return globParts.filter((gs) => gs.length);
}

function partsMatch(a: string[], b: string[]): string[] | false {
  let ai = 0;
  let bi = 0;
  const result: string[] = [];
  let which = "";
  while (ai < a.length && bi < b.length) {
    const x = a[ai] as string;
    const y = b[bi] as string;
    if (x === y) {
      result.push(which === "b" ? y : x);
      ai++;
      bi++;
    } else if (x === "**" && y === a[ai + 1]) {
      result.push(x);
      ai++;
    } else if (y === "**" && x === b[bi + 1]) {
      result.push(y);
      bi++;
    } else if (x === "*" && y && y !== "**") {
      if (which === "b") return false;
      which = "a";
      result.push(x);
      ai++;
      bi++;
    } else if (y === "*" && x && x !== "**") {
      if (which === "a") return false;
      which = "b";
      result.push(y);
      ai++;
      bi++;
    } else {
      return false;
    }
  }
  return a.length === b.length && result;
}

// ---------------------------------------------------------------------------------------------------------------
// One path portion → a literal name or a regular expression (minimatch's AST, dot mode).

const EXT_TYPES = new Set(["!", "?", "+", "*", "@"]);
const regExpEscape = (s: string) => s.replace(/[-[\]{}()*+?.,\\^$|#\s]/g, "\\$&");
const RE_SPECIALS = new Set("().*{}+?[]^$\\!");

/** Removes glob escapes from a non-magic portion: `\*` → `*`, `[a]` → `a`. */
export function unescapeGlob(s: string): string {
  return s.replace(/((?!\\).|^)\[([^/\\])\]/g, "$1$2").replace(/\\([^/])/g, "$1");
}

function parseSegment(glob: string): Segment {
  if (glob === "**") return GLOBSTAR;
  if (glob === "") return "";
  const parsed = parseSequence(glob, 0, false);
  if (!parsed.magic) return unescapeGlob(glob);
  const onlyStars = /^\*+$/.test(glob);
  const src = onlyStars ? "[^/]+?" : parsed.src;
  // With dot:true a magic portion still never matches `.` or `..`.
  return new RegExp(`^(?!\\.\\.?$)${src}$`, parsed.unicode ? "u" : "");
}

interface Parsed {
  src: string;
  magic: boolean;
  unicode: boolean;
  /** Index just past what was consumed (the closing `)` of an extglob body). */
  end: number;
}

/**
 * Converts glob text from `start` to a regular-expression source, stopping at an unescaped `|` or `)` when
 * inside an extglob (`inExt`).
 */
function parseSequence(glob: string, start: number, inExt: boolean): Parsed {
  let src = "";
  let magic = false;
  let unicode = false;
  let inStar = false;
  for (let i = start; i < glob.length; i++) {
    const c = glob.charAt(i);
    if (inExt && (c === "|" || c === ")")) return { src, magic, unicode, end: i };
    if (EXT_TYPES.has(c) && glob.charAt(i + 1) === "(") {
      const ext = parseExtglob(glob, i);
      if (ext) {
        src += ext.src(() => parseSequence(glob, ext.end, inExt).src);
        magic = true;
        unicode ||= ext.unicode;
        i = ext.end - 1;
        inStar = false;
        continue;
      }
    }
    if (c === "*") {
      if (!inStar) src += "[^/]*?";
      inStar = true;
      magic = true;
      continue;
    }
    inStar = false;
    if (c === "\\") {
      if (i === glob.length - 1) {
        src += "\\\\";
      } else {
        const next = glob.charAt(++i);
        src += (RE_SPECIALS.has(next) ? "\\" : "") + next;
      }
      continue;
    }
    if (c === "[") {
      const cls = parseClass(glob, i);
      if (cls) {
        src += cls.src;
        magic ||= cls.magic;
        unicode ||= cls.unicode;
        i = cls.end - 1;
        continue;
      }
    }
    if (c === "?") {
      src += "[^/]";
      magic = true;
      continue;
    }
    src += regExpEscape(c);
  }
  return { src, magic, unicode, end: glob.length };
}

/** `@(a|b)`, `?(…)`, `+(…)`, `*(…)`, `!(…)`; undefined when the group does not close (then it is literal). */
function parseExtglob(
  glob: string,
  at: number,
): { src: (rest: () => string) => string; end: number; unicode: boolean } | undefined {
  const type = glob.charAt(at);
  const alternatives: string[] = [];
  let unicode = false;
  let i = at + 2;
  for (;;) {
    const part = parseSequence(glob, i, true);
    if (part.end >= glob.length) return undefined;
    alternatives.push(part.src);
    unicode ||= part.unicode;
    i = part.end + 1;
    if (glob.charAt(part.end) === ")") break;
  }
  const body = alternatives.join("|");
  const end = i;
  const src = (rest: () => string) => {
    switch (type) {
      case "!":
        return `(?:(?!(?:${body})${rest()}$)[^/]*?)`;
      case "?":
        return `(?:${body})?`;
      case "+":
        return `(?:${body})+`;
      case "*":
        return `(?:${body})*`;
      default:
        return `(?:${body})`;
    }
  };
  return { src, end, unicode };
}

const POSIX_CLASSES: [string, string, boolean, boolean][] = [
  ["[:alnum:]", "\\p{L}\\p{Nl}\\p{Nd}", true, false],
  ["[:alpha:]", "\\p{L}\\p{Nl}", true, false],
  ["[:ascii:]", "\\x00-\\x7f", false, false],
  ["[:blank:]", "\\p{Zs}\\t", true, false],
  ["[:cntrl:]", "\\p{Cc}", true, false],
  ["[:digit:]", "\\p{Nd}", true, false],
  ["[:graph:]", "\\p{Z}\\p{C}", true, true],
  ["[:lower:]", "\\p{Ll}", true, false],
  ["[:print:]", "\\p{C}", true, false],
  ["[:punct:]", "\\p{P}", true, false],
  ["[:space:]", "\\p{Z}\\t\\r\\n\\v\\f", true, false],
  ["[:upper:]", "\\p{Lu}", true, false],
  ["[:word:]", "\\p{L}\\p{Nl}\\p{Nd}\\p{Pc}", true, false],
  ["[:xdigit:]", "A-Fa-f0-9", false, false],
];
const braceEscape = (s: string) => s.replace(/[-[\]\\]/g, "\\$&");

/** A `[...]` class starting at `at` (minimatch's parseClass); undefined when it does not close (`[` is literal). */
function parseClass(
  glob: string,
  at: number,
): { src: string; magic: boolean; unicode: boolean; end: number } | undefined {
  const ranges: string[] = [];
  const negs: string[] = [];
  let i = at + 1;
  let sawStart = false;
  let unicode = false;
  let escaping = false;
  let negate = false;
  let endPos = at;
  let rangeStart = "";
  const unmatchable = { src: "$.", magic: true, unicode: false, end: glob.length };
  scan: while (i < glob.length) {
    const c = glob.charAt(i);
    if ((c === "!" || c === "^") && i === at + 1) {
      negate = true;
      i++;
      continue;
    }
    if (c === "]" && sawStart && !escaping) {
      endPos = i + 1;
      break;
    }
    sawStart = true;
    if (c === "\\" && !escaping) {
      escaping = true;
      i++;
      continue;
    }
    if (c === "[" && !escaping) {
      for (const [cls, unip, u, neg] of POSIX_CLASSES) {
        if (!glob.startsWith(cls, i)) continue;
        if (rangeStart) return unmatchable;
        i += cls.length;
        (neg ? negs : ranges).push(unip);
        unicode ||= u;
        continue scan;
      }
    }
    escaping = false;
    if (rangeStart) {
      if (c > rangeStart) ranges.push(`${braceEscape(rangeStart)}-${braceEscape(c)}`);
      else if (c === rangeStart) ranges.push(braceEscape(c));
      rangeStart = "";
      i++;
      continue;
    }
    if (glob.startsWith("-]", i + 1)) {
      ranges.push(braceEscape(`${c}-`));
      i += 2;
      continue;
    }
    if (glob.startsWith("-", i + 1)) {
      rangeStart = c;
      i += 2;
      continue;
    }
    ranges.push(braceEscape(c));
    i++;
  }
  if (endPos < i) return undefined;
  if (!ranges.length && !negs.length) return unmatchable;
  const only = ranges[0] ?? "";
  if (negs.length === 0 && ranges.length === 1 && /^\\?.$/.test(only) && !negate) {
    return { src: regExpEscape(only.length === 2 ? only.slice(-1) : only), magic: false, unicode: false, end: endPos };
  }
  const sranges = `[${negate ? "^" : ""}${ranges.join("")}]`;
  const snegs = `[${negate ? "" : "^"}${negs.join("")}]`;
  const src = ranges.length && negs.length ? `(${sranges}|${snegs})` : ranges.length ? sranges : snegs;
  return { src, magic: true, unicode, end: endPos };
}
