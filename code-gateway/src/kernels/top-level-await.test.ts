import vm from "node:vm";
import { describe, expect, it } from "vitest";
import { wrapTopLevelAwait } from "./top-level-await.js";

describe("wrapTopLevelAwait", () => {
  const run = async (code: string, context: Record<string, unknown> = {}) => {
    const wrapped = wrapTopLevelAwait(code);
    if (!wrapped) throw new Error("did not parse");
    const sandbox = vm.createContext(context);
    return { value: await vm.runInContext(wrapped, sandbox), globals: sandbox };
  };

  it("returns the last expression and keeps declarations as globals", async () => {
    const { value, globals } = await run(
      "const a = await Promise.resolve(1);\nlet { b, c: [d] } = { b: 2, c: [3] };\nlet e;\nfunction f() { return a + b + d; }\nclass G {}\nf()",
    );
    expect(value).toBe(6);
    expect(globals).toMatchObject({ a: 1, b: 2, d: 3, e: undefined });
    expect(typeof globals.f).toBe("function");
    expect(typeof globals.G).toBe("function");
  });

  it("runs E2B's top-level await cell", async () => {
    const { value } = await run(
      "\n    async function main() {\n        return 'Hello, World!'\n    }\n\n    await main()\n",
    );
    expect(value).toBe("Hello, World!");
  });

  it("yields undefined when the cell ends in a statement, and undefined for code that does not parse", async () => {
    expect((await run("await null; const x = 1;")).value).toBeUndefined();
    expect(wrapTopLevelAwait("await (")).toBeUndefined();
  });
});
