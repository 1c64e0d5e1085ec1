import { describe, expect, it } from "vitest";
import { rewriteImports } from "./imports.js";

describe("rewriteImports", () => {
  const run = (code: string): Record<string, unknown> => {
    const scope: Record<string, unknown> = {
      require: (id: string) => ({ id, named: `${id}.named`, other: 2, default: `${id}.default`, __esModule: true }),
      __warrenDefault: (m: { default: unknown }) => m.default,
    };
    const body = `${rewriteImports(code)}\nreturn { ${[...code.matchAll(/\b(a|b|c|ns|def)\b/g)]
      .map((m) => m[1])
      .filter((v, i, all) => all.indexOf(v) === i)
      .join(", ")} };`;
    return new Function(...Object.keys(scope), body)(...Object.values(scope)) as Record<string, unknown>;
  };

  it("turns named, renamed, default, namespace and side-effect imports into requires", () => {
    expect(run("import { named as a, other as b } from 'm'")).toEqual({ a: "m.named", b: 2 });
    expect(run('import def from "x"')).toEqual({ def: "x.default" });
    expect(run("import * as ns from 'y'")).toMatchObject({ ns: { id: "y" } });
    expect(run("import def, { other as c } from 'z';")).toEqual({ def: "z.default", c: 2 });
    expect(rewriteImports("import 'side-effect'")).toBe('require("side-effect");');
  });

  it("handles multi-line import lists and leaves dynamic import() and other code alone", () => {
    expect(run("import {\n  named as a,\n  other as b,\n} from 'm'\n")).toEqual({ a: "m.named", b: 2 });
    const untouched =
      "const m = await import('x');\nconst important = 1; // import x from 'y' in a comment is mid-line";
    expect(rewriteImports(untouched)).toBe(untouched);
  });
});
