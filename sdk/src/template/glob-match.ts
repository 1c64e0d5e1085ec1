import { dropDotPortions, GLOBSTAR, type PatternParts, type Segment } from "./glob-pattern.js";

/** Matching a whole `/`-separated path against compiled patterns (minimatch's `match`/`matchOne`), for ignores. */

/** Does `path` match one of the compiled alternatives? */
export function matchesPath(path: string, compiled: readonly PatternParts[]): boolean {
  const file = path.split(/\/+/);
  return compiled.some((p) => matchOne(levelTwoFileOptimize([...file]), p.segments));
}

function levelTwoFileOptimize(parts: string[]): string[] {
  let didSomething: boolean;
  do {
    didSomething = false;
    didSomething = dropDotPortions(parts);
    for (let dd = parts.indexOf("..", 1); dd !== -1; dd = parts.indexOf("..", dd + 1)) {
      const p = parts[dd - 1];
      if (p && p !== "." && p !== ".." && p !== "**") {
        didSomething = true;
        parts.splice(dd - 1, 2);
        dd -= 2;
      }
    }
  } while (didSomething);
  return parts.length === 0 ? [""] : parts;
}

function matchPortion(f: string, p: Segment): boolean {
  if (p === GLOBSTAR) return false;
  return typeof p === "string" ? f === p : p.test(f);
}

function matchOne(file: string[], pattern: Segment[]): boolean {
  return pattern.includes(GLOBSTAR) ? matchGlobstar(file, pattern) : matchPlain(file, pattern, 0, 0);
}

function matchPlain(file: string[], pattern: Segment[], fileIndex: number, patternIndex: number): boolean {
  let fi = fileIndex;
  let pi = patternIndex;
  for (; fi < file.length && pi < pattern.length; fi++, pi++) {
    if (!matchPortion(file[fi] as string, pattern[pi] as Segment)) return false;
  }
  if (fi === file.length && pi === pattern.length) return true;
  if (fi === file.length) return false;
  return fi === file.length - 1 && file[fi] === "";
}

function matchGlobstar(file: string[], pattern: Segment[]): boolean {
  const firstgs = pattern.indexOf(GLOBSTAR);
  const lastgs = pattern.lastIndexOf(GLOBSTAR);
  const head = pattern.slice(0, firstgs);
  const body = pattern.slice(firstgs + 1, lastgs);
  const tail = pattern.slice(lastgs + 1);
  let fileIndex = 0;
  if (head.length) {
    if (!matchPlain(file.slice(0, head.length), head, 0, 0)) return false;
    fileIndex += head.length;
  }
  let fileTailMatch = 0;
  if (tail.length) {
    if (tail.length + fileIndex > file.length) return false;
    let tailStart = file.length - tail.length;
    if (matchPlain(file, tail, tailStart, 0)) {
      fileTailMatch = tail.length;
    } else {
      if (file[file.length - 1] !== "" || fileIndex + tail.length === file.length) return false;
      tailStart--;
      if (!matchPlain(file, tail, tailStart, 0)) return false;
      fileTailMatch = tail.length + 1;
    }
  }
  const badDot = (f: string | undefined) => f === "." || f === "..";
  if (!body.length) {
    let sawSome = !!fileTailMatch;
    for (let i = fileIndex; i < file.length - fileTailMatch; i++) {
      sawSome = true;
      if (badDot(file[i])) return false;
    }
    return sawSome;
  }
  const sections: { body: Segment[]; after: number }[] = [{ body: [], after: 0 }];
  const nonGsPartsSums = [0];
  let nonGsParts = 0;
  for (const b of body) {
    if (b === GLOBSTAR) {
      nonGsPartsSums.push(nonGsParts);
      sections.push({ body: [], after: 0 });
    } else {
      (sections[sections.length - 1] as { body: Segment[] }).body.push(b);
      nonGsParts++;
    }
  }
  const fileLength = file.length - fileTailMatch;
  let k = sections.length - 1;
  for (const s of sections) s.after = fileLength - ((nonGsPartsSums[k--] ?? 0) + s.body.length);

  const sectionsFrom = (fi: number, si: number, sawTail: boolean, depth: number): boolean | null => {
    const section = sections[si];
    if (!section) {
      for (let i = fi; i < file.length; i++) {
        sawTail = true;
        if (badDot(file[i])) return false;
      }
      return sawTail;
    }
    for (let at = fi; at <= section.after; at++) {
      if (depth < 200 && matchPlain(file.slice(0, at + section.body.length), section.body, at, 0)) {
        const sub = sectionsFrom(at + section.body.length, si + 1, sawTail, depth + 1);
        if (sub !== false) return sub;
      }
      if (badDot(file[at])) return false;
    }
    return null;
  };
  return !!sectionsFrom(fileIndex, 0, !!fileTailMatch, 0);
}
