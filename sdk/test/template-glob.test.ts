import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Template as E2BTemplate } from "e2b";
import { afterAll, describe, expect, test } from "vitest";
import { Template } from "../src/index.js";

// Which files a COPY selects decides its filesHash. For many source patterns and ignore lists, Warren's
// selection (its port of npm glob's walk) must hash the same as the `e2b` SDK's (npm glob itself).

const ctx = mkdtempSync(join(tmpdir(), "warren-glob-"));
afterAll(() => rmSync(ctx, { recursive: true, force: true }));
const files = [
  "a.txt",
  "b.log",
  ".hidden",
  "sub/app.js",
  "sub/.env",
  "sub/deeper/x.txt",
  "sub/deeper/y.log",
  "node_modules/m/index.js",
  "d/1.txt",
  "d/2.md",
  "d/10.txt",
  "weird[1]/f",
  "sp ace/f g",
  "x{a}/q",
  "other/o1",
  "other/inner/o2",
  "a+b/c",
];
for (const f of files) {
  mkdirSync(dirname(join(ctx, f)), { recursive: true });
  writeFileSync(join(ctx, f), f);
}
symlinkSync("a.txt", join(ctx, "link-to-a"));
symlinkSync("../other", join(ctx, "sub", "linkdir"));
symlinkSync("other", join(ctx, "toplinkdir"));
symlinkSync("nowhere", join(ctx, "broken"));

const patterns = [
  "a.txt",
  ".",
  "./sub",
  "sub",
  "sub/",
  "*.txt",
  "**/*.txt",
  "d/*.txt",
  "sub/**",
  "sub/**/*",
  "**/*",
  "**",
  "*",
  "?.txt",
  "[ab].*",
  "[!a]*",
  "[^a]*",
  "{a,b}.*",
  "sub/{app,x}.js",
  "d/{1..10}.txt",
  "{sub,d}/**/*.txt",
  "link-to-a",
  "toplinkdir",
  "toplinkdir/*",
  "toplinkdir/**",
  "sub/linkdir/**",
  "sub/linkdir/*",
  "broken",
  "weird\\[1\\]",
  "weird?1?",
  "sp ace",
  "sub/../a.txt",
  "./sub/deeper/../app.js",
  "*(a|b).*",
  "@(a|b).txt",
  "!(a).txt",
  "+(a).txt",
  "a+b",
  "x{a}",
  "**/deeper/**",
  "sub/**/x.txt",
  "**/*.log",
  "[[:alpha:]].txt",
  "d/[0-9].*",
  "d/[[:digit:]]*",
  "other/**/..",
  "sub/deeper/..",
  "./**/*.js",
  "sub//app.js",
  "*/",
  "**/",
  "d/*.{txt,md}",
];
const ignores: string[][] = [
  [],
  ["node_modules"],
  ["node_modules/**"],
  ["*.log"],
  ["**/*.log"],
  ["sub"],
  ["sub/**"],
  [".*"],
  ["./sub/deeper"],
  ["d/*"],
  ["**/.env", "other"],
  [join(ctx, "sub/**")],
  ["{sub,d}/**"],
  ["**/deeper"],
  ["*"],
];

async function outcome(lib: typeof Template, pattern: string, ignore: string[]) {
  try {
    const t = lib({ fileContextPath: ctx, fileIgnorePatterns: ignore }).fromImage("x").copy(pattern, "/dest/");
    return JSON.parse(await lib.toJSON(t)).steps[0].filesHash as string;
  } catch (error) {
    return `${(error as Error).name}: ${(error as Error).message}`;
  }
}

describe("COPY source selection hashes like e2b's (npm glob)", () => {
  for (const pattern of patterns) {
    test(`copy('${pattern}') under ${ignores.length} ignore lists`, async () => {
      const diffs: string[] = [];
      for (const ignore of ignores) {
        const ours = await outcome(Template, pattern, ignore);
        const theirs = await outcome(E2BTemplate as unknown as typeof Template, pattern, ignore);
        if (ours !== theirs) diffs.push(`ignore ${JSON.stringify(ignore)}: ${ours} ≠ ${theirs}`);
      }
      expect(diffs).toEqual([]);
    });
  }
});
