import { fileURLToPath } from "node:url";
import { Headers as FetchFreeHeaders } from "headers-polyfill";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectUnary, scratchName, sdkSandbox, startTestEnvd, type TestEnvd } from "./harness.js";

const HOOK = fileURLToPath(new URL("./loaded-modules.cjs", import.meta.url));

/** What a Headers object holds, seen through every way Connect reads one. */
function observe(headers: Headers): unknown {
  const forEach: [string, string][] = [];
  headers.forEach((value, name) => {
    forEach.push([name, value]);
  });
  return {
    entries: [...headers.entries()].sort(),
    forEach: forEach.sort(),
    get: ["content-type", "X-Multi", "grpc-status", "absent"].map((name) => headers.get(name)),
    has: ["Content-Type", "x-multi", "absent"].map((name) => headers.has(name)),
  };
}

describe("envd's Headers (web-headers.ts)", () => {
  it("holds what Node.js's Headers holds for the operations Connect uses", () => {
    const build = (H: typeof Headers) => {
      const fromRecord = new H({ "Content-Type": "application/connect+json", "X-Multi": "a" });
      fromRecord.append("x-multi", "b");
      fromRecord.set("Grpc-Status", "0");
      fromRecord.append("Trailer", "x");
      fromRecord.delete("trailer");
      const fromPairs = new H([
        ["x-multi", "1"],
        ["X-Multi", "2"],
      ]);
      const copied = new H(fromRecord);
      copied.set("content-type", "application/json");
      return [fromRecord, fromPairs, copied, new H()].map(observe);
    };
    expect(build(FetchFreeHeaders as unknown as typeof Headers)).toEqual(build(Headers));
  });

  describe("in a running envd", () => {
    let envd: TestEnvd;
    beforeAll(async () => {
      envd = await startTestEnvd({ defaultUser: "root", warmup: true, nodeArgs: ["--require", HOOK] });
    });
    afterAll(() => envd?.stop());

    it("serves commands, files and errors without loading Node.js's fetch implementation", async () => {
      const sandbox = sdkSandbox(envd);
      expect((await sandbox.commands.run("echo ok")).stdout).toBe("ok\n");
      const path = `/tmp/${scratchName("headers")}`;
      await sandbox.files.write(path, "hello");
      expect(await sandbox.files.read(path)).toBe("hello");
      // An error answer carries metadata (ConnectError's Headers).
      const missing = await connectUnary(envd, "filesystem.Filesystem/Stat", { path: `${path}-absent` });
      expect(missing.status).toBe(404);
      await sandbox.files.remove(path);

      const before = envd.logs().length;
      envd.child.kill("SIGUSR2");
      let line: string | undefined;
      for (let i = 0; i < 100 && !line; i++) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        line = /LOADED-MODULES (.*)\n/.exec(envd.logs().slice(before))?.[1];
      }
      const loaded = JSON.parse(line ?? "[]") as string[];
      expect(loaded.length).toBeGreaterThan(0);
      expect(loaded.filter((name) => name.includes("undici"))).toEqual([]);
    });
  });
});
