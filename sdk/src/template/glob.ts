import { lstatSync, readdirSync } from "node:fs";
import { basename, relative, resolve, sep } from "node:path";
import { matchesPath } from "./glob-match.js";
import { compilePattern, GLOBSTAR, type PatternParts, type Segment } from "./glob-pattern.js";

/**
 * The file walk of npm `glob` 13 (`glob(pattern, {cwd, dot: true, ignore, withFileTypes: true})`), which E2B's
 * SDK uses to pick a COPY step's files: the same traversal, including its symlink rules (`**` does not descend
 * into a symlinked directory, except that a `**` after a literal prefix follows one symlink level once) and its
 * ignore rules (a pattern excludes matching entries only; one ending in `/**` also prunes the walk).
 */

type EntryType = "unknown" | "file" | "dir" | "symlink" | "other" | "missing";

/** A path in the walk, known by its absolute path; its type comes from a dirent or an lstat. */
export class GlobEntry {
  private readOnce = false;
  private notDir = false;
  private children: GlobEntry[] = [];

  constructor(
    private readonly walk: EntryRegistry,
    readonly fullpath: string,
    public type: EntryType,
  ) {}

  get name(): string {
    return basename(this.fullpath);
  }

  /** Path relative to the walk's cwd, `/`-separated; "" for the cwd itself. */
  relative(): string {
    return relative(this.walk.cwd, this.fullpath).split(sep).join("/");
  }

  isDirectory(): boolean {
    return this.type === "dir";
  }

  isSymbolicLink(): boolean {
    return this.type === "symlink";
  }

  lstat(): GlobEntry | undefined {
    try {
      const st = lstatSync(this.fullpath);
      this.type = st.isSymbolicLink() ? "symlink" : st.isDirectory() ? "dir" : st.isFile() ? "file" : "other";
      return this;
    } catch {
      this.type = "missing";
      return undefined;
    }
  }

  canReaddir(): boolean {
    if (this.notDir || this.type === "missing") return false;
    return this.type === "unknown" || this.type === "dir" || this.type === "symlink";
  }

  readdir(): GlobEntry[] {
    if (this.readOnce) return this.children;
    this.readOnce = true;
    if (!this.canReaddir()) return this.children;
    try {
      this.children = readdirSync(this.fullpath, { withFileTypes: true }).map((d) => {
        const type: EntryType = d.isSymbolicLink()
          ? "symlink"
          : d.isDirectory()
            ? "dir"
            : d.isFile()
              ? "file"
              : "other";
        return this.walk.entry(resolve(this.fullpath, d.name), type);
      });
    } catch {
      this.notDir = true;
    }
    return this.children;
  }

  resolve(p: string): GlobEntry {
    return this.walk.entry(resolve(this.fullpath, p));
  }

  /** path-scurry compares names in Unicode NFKD form. */
  isNamed(name: string): boolean {
    return this.name.normalize("NFKD") === name.normalize("NFKD");
  }
}

/** One walk's entries, so a path is one object however it is reached. */
class EntryRegistry {
  private readonly entries = new Map<string, GlobEntry>();

  constructor(readonly cwd: string) {}

  entry(fullpath: string, type: EntryType = "unknown"): GlobEntry {
    let e = this.entries.get(fullpath);
    if (!e) {
      e = new GlobEntry(this, fullpath, type);
      this.entries.set(fullpath, e);
    } else if (e.type === "unknown" && type !== "unknown") {
      e.type = type;
    }
    return e;
  }
}

/** A compiled pattern from one position on (glob's Pattern). */
class Pattern {
  private restPattern: Pattern | null | undefined;
  private followGlobstar = true;

  constructor(
    private readonly segments: Segment[],
    private readonly globParts: string[],
    private readonly index: number,
  ) {}

  pattern(): Segment {
    return this.segments[this.index] as Segment;
  }

  isAbsolute(): boolean {
    return this.segments[0] === "" && this.segments.length > 1;
  }

  globString(): string {
    return this.globParts.slice(this.index).join("/");
  }

  hasMore(): boolean {
    return this.segments.length > this.index + 1;
  }

  rest(): Pattern | null {
    if (this.restPattern !== undefined) return this.restPattern;
    this.restPattern = this.hasMore() ? new Pattern(this.segments, this.globParts, this.index + 1) : null;
    return this.restPattern;
  }

  checkFollowGlobstar(): boolean {
    return !(this.index === 0 || this.pattern() !== GLOBSTAR || !this.followGlobstar);
  }

  markFollowGlobstar(): boolean {
    if (this.index === 0 || this.pattern() !== GLOBSTAR || !this.followGlobstar) return false;
    this.followGlobstar = false;
    return true;
  }
}

/** glob's Ignore: entries matching a pattern are dropped; `x/**` patterns also stop the walk below `x`. */
class Ignore {
  private readonly relativeMatchers: PatternParts[][] = [];
  private readonly relativeChildren: PatternParts[][] = [];
  private readonly absoluteMatchers: PatternParts[][] = [];
  private readonly absoluteChildren: PatternParts[][] = [];

  constructor(patterns: readonly string[]) {
    for (const ignore of patterns) {
      for (const { globParts } of compilePattern(ignore)) {
        const parts = [...globParts];
        while (parts[0] === "." && parts.length > 1) parts.shift();
        if (parts[0] === ".") continue;
        const absolute = parts[0] === "" && parts.length > 1;
        const text = absolute ? `/${parts.slice(1).join("/")}` : parts.join("/");
        const compiled = compilePattern(text);
        const children = parts[parts.length - 1] === "**";
        (absolute ? this.absoluteMatchers : this.relativeMatchers).push(compiled);
        if (children) (absolute ? this.absoluteChildren : this.relativeChildren).push(compiled);
      }
    }
  }

  ignored(e: GlobEntry): boolean {
    const rel = e.relative() || ".";
    if (this.relativeMatchers.some((m) => matchesPath(rel, m) || matchesPath(`${rel}/`, m))) return true;
    return this.absoluteMatchers.some((m) => matchesPath(e.fullpath, m) || matchesPath(`${e.fullpath}/`, m));
  }

  childrenIgnored(e: GlobEntry): boolean {
    const rel = `${e.relative() || "."}/`;
    if (this.relativeChildren.some((m) => matchesPath(rel, m))) return true;
    return this.absoluteChildren.some((m) => matchesPath(`${e.fullpath}/`, m));
  }
}

/** Which pattern/path pairs a walk has processed (glob's HasWalkedCache). */
class WalkedCache {
  constructor(private readonly store = new Map<string, Set<string>>()) {}

  copy(): WalkedCache {
    return new WalkedCache(new Map([...this.store].map(([k, v]) => [k, new Set(v)])));
  }

  has(target: GlobEntry, pattern: Pattern): boolean {
    return this.store.get(target.fullpath)?.has(pattern.globString()) ?? false;
  }

  add(target: GlobEntry, pattern: Pattern): void {
    const set = this.store.get(target.fullpath);
    if (set) set.add(pattern.globString());
    else this.store.set(target.fullpath, new Set([pattern.globString()]));
  }
}

/** glob's Processor: for one directory, what matches and which children need walking with which patterns. */
class Processor {
  /** entry → whether it only matches if it is a directory. */
  readonly matches = new Map<GlobEntry, boolean>();
  readonly subwalks = new Map<GlobEntry, Pattern[]>();

  constructor(private readonly walked = new WalkedCache()) {}

  child(): Processor {
    return new Processor(this.walked.copy());
  }

  private addMatch(e: GlobEntry, ifDir: boolean): void {
    const current = this.matches.get(e);
    this.matches.set(e, current === undefined ? ifDir : current && ifDir);
  }

  private addSubwalk(target: GlobEntry, pattern: Pattern): void {
    if (!target.canReaddir()) return;
    const subs = this.subwalks.get(target);
    if (!subs) this.subwalks.set(target, [pattern]);
    else if (!subs.some((p) => p.globString() === pattern.globString())) subs.push(pattern);
  }

  subwalkTargets(): GlobEntry[] {
    return [...this.subwalks.keys()].filter((t) => t.canReaddir());
  }

  processPatterns(target: GlobEntry, patterns: Pattern[]): this {
    for (const start of patterns) {
      let t = target;
      let pattern: Pattern = start;
      this.walked.add(t, pattern);
      if (pattern.isAbsolute()) {
        t = t.resolve("/");
        const rest = pattern.rest();
        if (!rest) {
          this.addMatch(t, false);
          continue;
        }
        pattern = rest;
      }
      if (t.type === "missing") continue;
      let p = pattern.pattern();
      let rest = pattern.rest();
      let changed = false;
      while (typeof p === "string" && rest) {
        t = t.resolve(p);
        pattern = rest;
        changed = true;
        p = pattern.pattern();
        rest = pattern.rest();
      }
      if (changed) {
        if (this.walked.has(t, pattern)) continue;
        this.walked.add(t, pattern);
      }
      if (typeof p === "string") {
        this.addMatch(t.resolve(p), p === ".." || p === "" || p === ".");
      } else if (p === GLOBSTAR) {
        if (!t.isSymbolicLink() || pattern.checkFollowGlobstar()) this.addSubwalk(t, pattern);
        const rp = rest?.pattern();
        const rrest = rest?.rest();
        if (!rest || ((rp === "" || rp === ".") && !rrest)) {
          this.addMatch(t, rp === "" || rp === ".");
        } else if (rp === "..") {
          const tp = t.resolve("..");
          if (!rrest) this.addMatch(tp, true);
          else if (!this.walked.has(tp, rrest)) this.addSubwalk(tp, rrest);
        }
      } else {
        this.addSubwalk(t, pattern);
      }
    }
    return this;
  }

  filterEntries(parent: GlobEntry, entries: GlobEntry[]): Processor {
    const patterns = this.subwalks.get(parent) ?? [];
    const results = this.child();
    for (const e of entries) {
      for (const pattern of patterns) {
        const p = pattern.pattern();
        const rest = pattern.rest();
        if (p === GLOBSTAR) results.testGlobstar(e, pattern, rest);
        else if (p instanceof RegExp) results.testRegExp(e, p, rest);
        else results.testString(e, p, rest);
      }
    }
    return results;
  }

  private testGlobstar(e: GlobEntry, pattern: Pattern, rest: Pattern | null): void {
    if (!pattern.hasMore()) this.addMatch(e, false);
    if (e.canReaddir()) {
      if (!e.isSymbolicLink()) this.addSubwalk(e, pattern);
      else if (rest && pattern.checkFollowGlobstar()) this.addSubwalk(e, rest);
      else if (pattern.markFollowGlobstar()) this.addSubwalk(e, pattern);
    }
    if (rest) {
      const rp = rest.pattern();
      if (typeof rp === "string" && rp !== ".." && rp !== "" && rp !== ".") this.testString(e, rp, rest.rest());
      else if (rp === "..") this.addSubwalk(e.resolve(".."), rest);
      else if (rp instanceof RegExp) this.testRegExp(e, rp, rest.rest());
    }
  }

  private testRegExp(e: GlobEntry, p: RegExp, rest: Pattern | null): void {
    if (!p.test(e.name)) return;
    if (!rest) this.addMatch(e, false);
    else this.addSubwalk(e, rest);
  }

  private testString(e: GlobEntry, p: string, rest: Pattern | null): void {
    if (!e.isNamed(p)) return;
    if (!rest) this.addMatch(e, false);
    else this.addSubwalk(e, rest);
  }
}

/** Entries under `cwd` matching `pattern`, never descending into what `ignore` prunes. Unordered. */
export function globEntries(pattern: string, cwd: string, ignore: readonly string[] = []): GlobEntry[] {
  const walk = new EntryRegistry(resolve(cwd));
  const root = walk.entry(walk.cwd);
  root.lstat();
  const ignorer = new Ignore(ignore);
  const seen = new Set<GlobEntry>();
  const found: GlobEntry[] = [];
  const patterns = compilePattern(pattern).map(({ segments, globParts }) => new Pattern(segments, globParts, 0));

  const ignored = (e: GlobEntry) => seen.has(e) || ignorer.ignored(e);
  const match = (e: GlobEntry, ifDir: boolean) => {
    const checked = e.type === "unknown" ? e.lstat() : e;
    if (!checked || e.type === "missing" || (ifDir && !e.canReaddir()) || ignored(e)) return;
    seen.add(e);
    found.push(e);
  };
  const emit = (processor: Processor) => {
    for (const [m, ifDir] of processor.matches) if (!ignored(m)) match(m, ifDir);
  };
  const walkDir = (target: GlobEntry, pats: Pattern[], processor: Processor): void => {
    if (ignorer.childrenIgnored(target)) return;
    processor.processPatterns(target, pats);
    emit(processor);
    for (const t of processor.subwalkTargets()) {
      const next = processor.filterEntries(t, t.readdir());
      emit(next);
      for (const [child, childPatterns] of next.subwalks) walkDir(child, childPatterns, next.child());
    }
  };
  walkDir(root, patterns, new Processor());
  return found;
}
