import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  archiveSource,
  commandEnv,
  copyPlan,
  envExpansionCommand,
  envPairs,
  hashKeys,
  StepError,
  shellQuote,
  stepKey,
  userCommand,
  workdirTarget,
} from "./build-steps.js";

const context = { user: "user", workdir: null, env: {} };

describe("template build steps", () => {
  it("hashes keys as E2B's HashKeys: sha256 of base then ';' + each key", () => {
    // sha256("v2;a;b")
    const expected = execFileSync("sh", ["-c", "printf 'v2;a;b' | sha256sum | cut -d' ' -f1"]).toString().trim();
    expect(hashKeys("v2", "a", "b")).toBe(expected);
    const step = { type: "RUN" as const, args: ["echo hi", "root"], force: false };
    expect(stepKey("prev", step)).toBe(hashKeys("prev", "RUN", "echo hi root", "<nil>"));
    expect(stepKey("prev", { ...step, args: ["echo hi"] })).not.toBe(stepKey("prev", step));
  });

  it("finds a COPY source inside the archive as E2B's SplitPattern does", () => {
    expect(archiveSource("a.txt")).toBe("a.txt");
    expect(archiveSource("sub")).toBe("sub");
    expect(archiveSource("sub/")).toBe("sub");
    expect(archiveSource("sub/app.js")).toBe("sub/app.js");
    expect(archiveSource("d/*.txt")).toBe("d");
    expect(archiveSource("*.txt")).toBe(".");
    expect(archiveSource("./x")).toBe("./x");
  });

  it("quotes like the SDK's q()", () => {
    expect(shellQuote("")).toBe("''");
    expect(shellQuote("/a/b-c_d.e")).toBe("/a/b-c_d.e");
    expect(shellQuote("it's")).toBe(`'it'"'"'s'`);
  });

  it("expands ENV values with the shell but never runs command substitution", () => {
    const out = (value: string) =>
      execFileSync("bash", ["-c", envExpansionCommand(value)], {
        env: { HOME: "/home/x", PATH: process.env.PATH },
      }).toString();
    expect(out("at $HOME")).toBe("at /home/x");
    // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell expansion, not a JS template
    expect(out("${HOME}/bin")).toBe("/home/x/bin");
    expect(out("$(echo pwned)")).toBe("$(echo pwned)");
    expect(out("`echo pwned`")).toBe("`echo pwned`");
    expect(out('quote " and \\ back')).toBe('quote " and \\ back');
  });

  it("refuses malformed ENV, USER and COPY steps with a message naming the problem", () => {
    expect(() => envPairs({ type: "ENV", args: ["A"], force: false })).toThrow(StepError);
    expect(() => envPairs({ type: "ENV", args: ["1A", "x"], force: false })).toThrow(/invalid variable name/);
    expect(envPairs({ type: "ENV", args: ["A", "1", "B", "2"], force: false })).toEqual([
      ["A", "1"],
      ["B", "2"],
    ]);
    expect(() => userCommand("root; rm -rf /")).toThrow(/invalid user name/);
    const copy = (args: string[], filesHash = "a".repeat(64)) =>
      copyPlan({ type: "COPY", args, force: false, filesHash }, context, "t1");
    expect(() => copy(["../etc/passwd", "/x"])).toThrow(/outside the build context/);
    expect(() => copy(["/etc/passwd", "/x"])).toThrow(/outside the build context/);
    expect(() => copy(["a", "/x", "", "9999"])).toThrow(/invalid mode/);
    expect(() => copy(["a", "/x", "bad owner"])).toThrow(/invalid owner/);
    expect(() => copyPlan({ type: "COPY", args: ["a", "/x"], force: false }, context, "t1")).toThrow(/filesHash/);
  });

  it("resolves WORKDIR against the current workdir, and appends the standard PATH when the env sets one", () => {
    expect(workdirTarget(context, "app")).toBe("/app");
    expect(workdirTarget({ ...context, workdir: "/srv" }, "app/../web")).toBe("/srv/web");
    expect(workdirTarget({ ...context, workdir: "/srv" }, "/opt")).toBe("/opt");
    expect(commandEnv({ ...context, env: { PATH: "/my/bin" } }).PATH).toBe(
      "/my/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    expect(commandEnv(context)).toEqual({});
  });

  it("COPY's script moves a file into a folder, renames it, and merges a folder's contents (run here on a scratch root)", () => {
    const root = mkdtempSync(join(tmpdir(), "copy-plan-"));
    try {
      const ctxDir = join(root, "ctx");
      execFileSync("mkdir", ["-p", join(ctxDir, "sub/deeper")]);
      writeFileSync(join(ctxDir, "a.txt"), "A");
      writeFileSync(join(ctxDir, "sub/b.txt"), "B");
      writeFileSync(join(ctxDir, "sub/deeper/c.txt"), "C");
      const me = execFileSync("id", ["-un"]).toString().trim();
      const run = (args: string[]) => {
        const plan = copyPlan(
          { type: "COPY", args, force: false, filesHash: "c".repeat(64) },
          { user: me, workdir: root, env: {} },
          `u${Math.random().toString(36).slice(2)}`,
        );
        execFileSync("tar", ["-czf", plan.archivePath, "-C", ctxDir, "a.txt", "sub"]);
        execFileSync("bash", ["-c", plan.command]);
      };
      run(["a.txt", "into/", "", "0600"]);
      expect(readFileSync(join(root, "into/a.txt"), "utf8")).toBe("A");
      expect(statSync(join(root, "into/a.txt")).mode & 0o777).toBe(0o600);
      run(["a.txt", "renamed.txt"]);
      expect(readFileSync(join(root, "renamed.txt"), "utf8")).toBe("A");
      run(["sub", "merged"]);
      expect(readFileSync(join(root, "merged/b.txt"), "utf8")).toBe("B");
      expect(readFileSync(join(root, "merged/deeper/c.txt"), "utf8")).toBe("C");
      expect(() => run(["missing.txt", "x"])).toThrow();
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
