/**
 * Brace expansion as minimatch does it (the `brace-expansion` package): comma sets, numeric and letter
 * sequences with padding and steps, nesting, escapes; a pattern without a closed `{...}` is returned as is.
 */

const ESC = {
  slash: "\0SLASH\0",
  open: "\0OPEN\0",
  close: "\0CLOSE\0",
  comma: "\0COMMA\0",
  period: "\0PERIOD\0",
};

export function braceExpand(pattern: string): string[] {
  if (!/\{(?:(?!\{).)*\}/.test(pattern)) return [pattern];
  let str = pattern;
  if (str.startsWith("{}")) str = `\\{\\}${str.slice(2)}`;
  const escaped = str
    .replace(/\\\\/g, ESC.slash)
    .replace(/\\\{/g, ESC.open)
    .replace(/\\\}/g, ESC.close)
    .replace(/\\,/g, ESC.comma)
    .replace(/\\\./g, ESC.period);
  return expandBraces(escaped, true).map((s) =>
    s
      .split(ESC.slash)
      .join("\\")
      .split(ESC.open)
      .join("{")
      .split(ESC.close)
      .join("}")
      .split(ESC.comma)
      .join(",")
      .split(ESC.period)
      .join("."),
  );
}

/** The outermost balanced `{...}` pair of `str` (balanced-match's `range`). */
function balancedRange(str: string): [number, number] | undefined {
  let ai = str.indexOf("{");
  let bi = str.indexOf("}", ai + 1);
  if (ai < 0 || bi <= 0) return undefined;
  const begs: number[] = [];
  let left = str.length;
  let right: number | undefined;
  let result: [number, number] | undefined;
  let i = ai;
  while (i >= 0 && !result) {
    if (i === ai) {
      begs.push(i);
      ai = str.indexOf("{", i + 1);
    } else if (begs.length === 1) {
      const r = begs.pop();
      if (r !== undefined) result = [r, bi];
    } else {
      const beg = begs.pop();
      if (beg !== undefined && beg < left) {
        left = beg;
        right = bi;
      }
      bi = str.indexOf("}", i + 1);
    }
    i = ai < bi && ai >= 0 ? ai : bi;
  }
  if (!result && begs.length && right !== undefined) result = [left, right];
  return result;
}

/** Splits a set body on its top-level commas: `a,{b,c},d` → `a`, `{b,c}`, `d`. */
function commaParts(body: string): string[] {
  const parts: string[] = [];
  let carry = "";
  let str = body;
  for (;;) {
    const r = balancedRange(str);
    if (!r) {
      const tail = str.split(",");
      tail[0] = carry + tail[0];
      parts.push(...tail);
      return parts;
    }
    const pre = str.slice(0, r[0]);
    const inner = str.slice(r[0] + 1, r[1]);
    const post = str.slice(r[1] + 1);
    const p = pre.split(",");
    p[0] = carry + p[0];
    p[p.length - 1] += `{${inner}}`;
    if (!post.length) {
      parts.push(...p);
      return parts;
    }
    carry = p.pop() ?? "";
    parts.push(...p);
    str = post;
  }
}

function sequence(body: string, alpha: boolean): string[] {
  const n = body.split(/\.\./);
  const numeric = (s: string) => (Number.isNaN(Number(s)) ? s.charCodeAt(0) : Number.parseInt(s, 10));
  const x = numeric(n[0] ?? "");
  const y = numeric(n[1] ?? "");
  const width = Math.max((n[0] ?? "").length, (n[1] ?? "").length);
  let incr = n.length === 3 ? Math.max(Math.abs(numeric(n[2] ?? "1")), 1) : 1;
  const reverse = y < x;
  if (reverse) incr = -incr;
  const pad = n.some((el) => /^-?0\d/.test(el));
  const out: string[] = [];
  for (let i = x; reverse ? i >= y : i <= y; i += incr) {
    let c: string;
    if (alpha) {
      c = String.fromCharCode(i);
      if (c === "\\") c = "";
    } else {
      c = String(i);
      if (pad && width > c.length) {
        const z = "0".repeat(width - c.length);
        c = i < 0 ? `-${z}${c.slice(1)}` : z + c;
      }
    }
    out.push(c);
  }
  return out;
}

function expandBraces(str: string, isTop: boolean): string[] {
  const r = balancedRange(str);
  if (!r) return [str];
  const pre = str.slice(0, r[0]);
  const body = str.slice(r[0] + 1, r[1]);
  const post = str.slice(r[1] + 1);
  const postExpanded = post.length ? expandBraces(post, false) : [""];
  if (/\$$/.test(pre)) return postExpanded.map((p) => `${pre}{${body}}${p}`);

  const isNumericSequence = /^-?\d+\.\.-?\d+(?:\.\.-?\d+)?$/.test(body);
  const isAlphaSequence = /^[a-zA-Z]\.\.[a-zA-Z](?:\.\.-?\d+)?$/.test(body);
  const isSequence = isNumericSequence || isAlphaSequence;
  const isOptions = body.includes(",");
  if (!isSequence && !isOptions) {
    // `{a},b}` → `{a\},b}`: a set may close later.
    if (/,(?!,).*\}/.test(post)) return expandBraces(`${pre}{${body}${ESC.close}${post}`, isTop);
    return postExpanded.map((p) => `${pre}{${body}}${p}`);
  }
  let values: string[];
  if (isSequence) {
    values = sequence(body, isAlphaSequence);
  } else {
    let parts = commaParts(body);
    if (parts.length === 1 && parts[0] !== undefined) {
      parts = expandBraces(parts[0], false).map((s) => `{${s}}`);
      if (parts.length === 1) return postExpanded.map((p) => pre + (parts[0] ?? "") + p);
    }
    values = parts.flatMap((p) => expandBraces(p, false));
  }
  const out: string[] = [];
  for (const value of values) {
    for (const p of postExpanded) {
      const expansion = pre + value + p;
      if (!isTop || isSequence || expansion) out.push(expansion);
    }
  }
  return out;
}
