import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as e2b from "e2b";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import type { TemplateBuilder, TemplateClass, TemplateFromImage, TemplateOptions } from "../src/index.js";
import * as warren from "../src/index.js";
import { makeContext } from "./template/fixtures.js";

// The same builder programs run with Warren's SDK and with the official `e2b` SDK: `Template.toJSON` (the
// trigger body, filesHash included) must be the same string, and a program that throws must throw the same
// error class and message in both.

/** What a program needs from an SDK: the factory and the ready-command helpers. */
interface Sdk {
  Template: (options?: TemplateOptions) => TemplateFromImage;
  toJSON: (t: TemplateClass) => Promise<string>;
  waitForPort: (port: number) => unknown;
  waitForURL: (url: string, statusCode?: number) => unknown;
  waitForProcess: (name: string) => unknown;
  waitForFile: (name: string) => unknown;
  waitForTimeout: (ms: number) => unknown;
}

const sdks: Record<"warren" | "e2b", Sdk> = {
  warren: {
    Template: warren.Template,
    toJSON: (t) => warren.Template.toJSON(t),
    ...pick(warren),
  },
  e2b: {
    Template: e2b.Template as unknown as Sdk["Template"],
    toJSON: (t) => e2b.Template.toJSON(t as never),
    ...pick(e2b),
  },
};

function pick(m: Record<string, unknown>) {
  return {
    waitForPort: m.waitForPort as Sdk["waitForPort"],
    waitForURL: m.waitForURL as Sdk["waitForURL"],
    waitForProcess: m.waitForProcess as Sdk["waitForProcess"],
    waitForFile: m.waitForFile as Sdk["waitForFile"],
    waitForTimeout: m.waitForTimeout as Sdk["waitForTimeout"],
  };
}

type Builder = TemplateFromImage & TemplateBuilder;
type Program = (t: Builder, sdk: Sdk) => TemplateClass;
type Outcome = { json: string } | { error: { name: string; message: string } };

let ctx: string;
let ignoreCtx: string;

/** Runs one program with one SDK; context `dir`, extra Template() options. */
async function run(sdk: Sdk, program: Program, dir: string, options: TemplateOptions = {}): Promise<Outcome> {
  try {
    const t = sdk.Template({ fileContextPath: dir, ...options }) as Builder;
    return { json: await sdk.toJSON(program(t, sdk)) };
  } catch (error) {
    const e = error as Error;
    return { error: { name: e.name, message: e.message } };
  }
}

async function expectSame(program: Program, dir = ctx, options: TemplateOptions = {}): Promise<Outcome> {
  const ours = await run(sdks.warren, program, dir, options);
  const theirs = await run(sdks.e2b, program, dir, options);
  expect(ours).toEqual(theirs);
  return ours;
}

beforeAll(() => {
  ctx = makeContext();
  writeFileSync(join(ctx, "gcp.json"), '{"type":"service_account","project_id":"p"}');
  ignoreCtx = makeContext("warren-tpl-ignore-");
  writeFileSync(join(ignoreCtx, ".dockerignore"), "# comment\n\n*.log\n  app/node_modules  \n!b.log\nd/*.md\n");
});

afterAll(() => {
  vi.restoreAllMocks();
});

const programs: Record<string, Program> = {
  "no from call (the default base image)": (t) => (t as unknown as TemplateBuilder).runCmd("true"),
  fromBaseImage: (t) => t.fromBaseImage(),
  "distro helpers with defaults": (t) => t.fromDebianImage(),
  "debian variant": (t) => t.fromDebianImage("bookworm-slim"),
  ubuntu: (t) => t.fromUbuntuImage(),
  "ubuntu variant": (t) => t.fromUbuntuImage("22.04"),
  fedora: (t) => t.fromFedoraImage(),
  alpine: (t) => t.fromAlpineImage(),
  arch: (t) => t.fromArchImage(),
  python: (t) => t.fromPythonImage(),
  "python version": (t) => t.fromPythonImage("3.12"),
  node: (t) => t.fromNodeImage(),
  bun: (t) => t.fromBunImage("1.1"),
  "fromImage with registry credentials": (t) => t.fromImage("ghcr.io/acme/img:1", { username: "u", password: "p" }),
  fromTemplate: (t) => t.fromTemplate("base").runCmd("true"),
  "fromTemplate after credentials keeps the registry": (t) =>
    (t.fromImage("x:1", { username: "u", password: "p" }) as Builder).fromTemplate("base"),
  "a second from call overwrites the first": (t) => (t.fromImage("a:1") as Builder).fromImage("b:2"),
  fromAWSRegistry: (t) =>
    t.fromAWSRegistry("123.dkr.ecr.eu-west-1.amazonaws.com/img:1", {
      accessKeyId: "AK",
      secretAccessKey: "SK",
      region: "eu-west-1",
    }),
  "fromGCPRegistry with an object": (t) =>
    t.fromGCPRegistry("gcr.io/p/img", { serviceAccountJSON: { type: "service_account", a: [1, 2] } }),
  "fromGCPRegistry with a file of the context": (t) =>
    t.fromGCPRegistry("gcr.io/p/img", { serviceAccountJSON: "gcp.json" }),
  "runCmd string, list and user": (t) =>
    t.fromImage("x").runCmd("echo a").runCmd(["echo b", "echo c"]).runCmd("id", { user: "root" }).runCmd([], {}),
  aptInstall: (t) =>
    t
      .fromImage("x")
      .aptInstall("curl")
      .aptInstall(["git", "vim"], { noInstallRecommends: true })
      .aptInstall("a", { fixMissing: true, noInstallRecommends: true }),
  pipInstall: (t) =>
    t
      .fromImage("x")
      .pipInstall()
      .pipInstall("numpy")
      .pipInstall(["a", "b==1"], { g: false })
      .pipInstall(undefined, { g: false }),
  "npmInstall and bunInstall": (t) =>
    t
      .fromImage("x")
      .npmInstall()
      .npmInstall("left-pad", { g: true })
      .npmInstall(["a", "b"], { dev: true })
      .npmInstall("c", { g: true, dev: true })
      .bunInstall()
      .bunInstall(["x"], { g: true, dev: true }),
  gitClone: (t) =>
    t
      .fromImage("x")
      .gitClone("https://github.com/a/b.git")
      .gitClone("https://h/x y.git", "/work dir", { branch: "feat/it's", depth: 2, user: "root" })
      .gitClone("git@h:a/b", undefined, { depth: 1 }),
  "file helpers": (t) =>
    t
      .fromImage("x")
      .remove("/tmp/a")
      .remove(["/a b", "/c"], { recursive: true, force: true, user: "root" })
      .rename("/x", "/y z", { force: true, user: "u" })
      .rename("a'b", "c")
      .makeDir("/data")
      .makeDir(["/d1", "/d 2"], { mode: 0o755, user: "root" })
      .makeDir("/m", { mode: 0o2775 })
      .makeSymlink("/a", "/b")
      .makeSymlink("/a", "/b", { force: true, user: "root" }),
  "envs, workdir, user": (t) =>
    t.fromImage("x").setEnvs({}).setEnvs({ A: "1", B: "two words", C: "$HOME" }).setWorkdir("/app").setUser("user"),
  "start command with waitForPort": (t, s) =>
    t.fromImage("x").setStartCmd("python3 -m http.server 8000", s.waitForPort(8000) as never),
  waitForURL: (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForURL("http://localhost:3000/health?a=b") as never),
  "waitForURL with a status": (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForURL("http://l/", 204) as never),
  waitForProcess: (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForProcess("my daemon") as never),
  waitForFile: (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForFile("/tmp/ready") as never),
  waitForTimeout: (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForTimeout(2500) as never),
  "waitForTimeout below a second": (t, s) => t.fromImage("x").setStartCmd("srv", s.waitForTimeout(10) as never),
  "a plain ready command, then setReadyCmd": (t) =>
    (t.fromImage("x").setStartCmd("srv", "sleep 1") as TemplateBuilder).setReadyCmd("true"),
  "setReadyCmd alone": (t) => t.fromImage("x").setReadyCmd("test -f /x"),
  "skipCache before everything": (t) => t.skipCache().fromImage("x").runCmd("a").copy("hello.txt", "/app/"),
  "skipCache in the middle": (t) => t.fromImage("x").runCmd("a").skipCache().runCmd("b").setEnvs({ K: "v" }),
  "skipCache then a from call forces the template": (t) =>
    (t.fromImage("x").runCmd("a").skipCache() as Builder).fromTemplate("base").runCmd("b"),
  "copy a file": (t) => t.fromImage("x").copy("hello.txt", "/app/"),
  "copy with user, mode and forceUpload": (t) =>
    t.fromImage("x").copy("exec.sh", "/usr/local/bin/run", { user: "root:root", mode: 0o755, forceUpload: true }),
  "copy a directory": (t) => t.fromImage("x").copy("app", "/srv/app"),
  "copy the context": (t) => t.fromImage("x").copy(".", "/ctx"),
  "copy ./dir and dir/": (t) => t.fromImage("x").copy("./app", "/a").copy("app/", "/b").copy("app/lib", "lib"),
  "copy globs": (t) =>
    t
      .fromImage("x")
      .copy("*.txt", "/t/")
      .copy("d/*.txt", "/d/")
      .copy("**/*.py", "/py/")
      .copy("{a,hello}.txt", "/ab/")
      .copy("d/[12].*", "/c/")
      .copy("app/**", "/all/"),
  "copy symlinks": (t) =>
    t
      .fromImage("x")
      .copy("link-to-a", "/app/")
      .copy("toplinkdir", "/l/")
      .copy("broken", "/b/")
      .copy("link-to-a", "/r/", { resolveSymlinks: true })
      .copy("toplinkdir", "/rd/", { resolveSymlinks: true })
      .copy("broken", "/rb/", { resolveSymlinks: true }),
  "a directory holding a symlinked directory": (t) => t.fromImage("x").copy("app", "/app/").copy(".", "/all/"),
  "copy options that travel in the step": (t) =>
    t.fromImage("x").copy("a.txt", "/a", { gzip: false }).copy("a.txt", "/b", { resolveSymlinks: false, gzip: true }),
  "copy several sources": (t) => t.fromImage("x").copy(["a.txt", "d", ".env"], "/many/", { user: "u" }),
  copyItems: (t) =>
    t.fromImage("x").copyItems([
      { src: "hello.txt", dest: "/h" },
      { src: ["d", "other"], dest: "/x/", mode: 0o700, forceUpload: true, user: "u" },
      { src: "link-to-a", dest: "/l", resolveSymlinks: true, gzip: false },
    ]),
  "odd names": (t) =>
    t.fromImage("x").copy("sp ace", "/s/").copy("weird?1?", "/w/").copy("emptydir", "/e/").copy("empty.bin", "/z"),
  "addMcpServer on mcp-gateway": (t) => t.fromTemplate("mcp-gateway").addMcpServer(["github", "exa"]).addMcpServer("x"),
  "devcontainer helpers": (t) =>
    t.fromTemplate("devcontainer").betaDevContainerPrebuild("/work/my dir").betaSetDevContainerStart("/work/my dir"),
  "toJSON of a template with everything": (t, s) =>
    t
      .skipCache()
      .fromPythonImage("3.11")
      .copy("app", "/app", { user: "user" })
      .pipInstall(["fastapi"])
      .setWorkdir("/app")
      .setEnvs({ PORT: "8000" })
      .setUser("user")
      .setStartCmd("uvicorn main:app", s.waitForPort(8000) as never),
};

describe("Template.toJSON is E2B's for the same builder calls", () => {
  for (const [name, program] of Object.entries(programs)) {
    test(name, async () => {
      const outcome = await expectSame(program);
      expect(outcome).toHaveProperty("json");
    });
  }

  test("a .dockerignore and fileIgnorePatterns shape the files (and so the hashes) the same way", async () => {
    const program: Program = (t) => t.fromImage("x").copy(".", "/all").copy("app", "/app").copy("*.log", "/logs/");
    await expectSame(program, ignoreCtx);
    for (const patterns of [["node_modules"], ["**/node_modules/**"], ["app/lib"], ["app/lib/**", ".*"], ["*.txt"]]) {
      const outcome = await expectSame((t) => t.fromImage("x").copy(".", "/all").copy("app", "/app"), ctx, {
        fileIgnorePatterns: patterns,
      });
      expect(outcome).toHaveProperty("json");
    }
  });

  test("toJSON without hashes", async () => {
    const t = (sdk: Sdk) => sdk.Template({ fileContextPath: ctx }).fromImage("x").copy("a.txt", "/a");
    expect(await warren.Template.toJSON(t(sdks.warren), false)).toBe(
      await e2b.Template.toJSON(t(sdks.e2b) as never, false),
    );
  });
});

describe("the same errors as E2B", () => {
  const failing: Record<string, Program> = {
    "an absolute copy source": (t) => t.fromImage("x").copy("/etc/passwd", "/x"),
    "a copy source outside the context": (t) => t.fromImage("x").copy("app/../../x", "/x"),
    "a copy source matching nothing (when hashed)": (t) => t.fromImage("x").copy("nothing-*.txt", "/x"),
    "a glob-like directory name that matches nothing": (t) => t.fromImage("x").copy("weird[1]", "/w/"),
    "incomplete registry credentials": (t) => t.fromImage("x", { username: "u", password: "" }),
    "addMcpServer without mcp-gateway": (t) => t.fromTemplate("base").addMcpServer("x"),
    "devcontainer helpers without devcontainer": (t) => t.fromTemplate("base").betaDevContainerPrebuild("/d"),
    "a multi-stage Dockerfile": (t) => t.fromDockerfile("FROM a AS b\nRUN x\nFROM c\n"),
    "a Dockerfile without FROM": (t) => t.fromDockerfile("RUN echo hi\n"),
    "a Dockerfile COPY of an absolute path": (t) => t.fromDockerfile("FROM x\nCOPY --from=builder /x /y\n"),
  };
  for (const [name, program] of Object.entries(failing)) {
    test(name, async () => {
      const outcome = await expectSame(program);
      expect(outcome).toHaveProperty("error");
    });
  }
});

describe("fromDockerfile translates like E2B's", () => {
  const dockerfiles: Record<string, string> = {
    basic: "FROM ubuntu:22.04\nRUN apt-get update\nCOPY hello.txt /app/\nCMD python3 -m http.server\n",
    "continuations, comments, blank lines inside a continuation":
      "# a comment\nFROM node:20 AS build\nRUN apt-get update && \\\n    # inner comment\n    apt-get install -y \\\n\n      curl   git\nRUN echo done \\  \n  && true\n",
    "exec-form CMD and ENTRYPOINT": 'FROM x\nENTRYPOINT ["node", "server.js"]\nCMD ["--port", "8080"]\n',
    "shell-form ENTRYPOINT": "FROM x\nENTRYPOINT exec node server.js\n",
    "ENV and ARG forms":
      'FROM x\nENV A=1\nENV B 2\nENV C=3 D=4\nENV E=5 F=6 G=7\nENV H="two words"\nENV I two words\nARG J\nARG K=k\nARG L M=m\n',
    "COPY and ADD with flags and several sources":
      "FROM x\nCOPY --chown=user:user app /app/\nADD a.txt d /dest/\nCOPY --from=builder a.txt /y\nCOPY --chmod=755 exec.sh /bin/\nCOPY --chown= a.txt /z\n",
    "WORKDIR and USER given: no E2B defaults": "FROM x\nWORKDIR /srv\nUSER nobody\nRUN id\n",
    "EXPOSE, VOLUME, LABEL and others skipped":
      "FROM x\nEXPOSE 80\nVOLUME /data\nLABEL a=b\nHEALTHCHECK CMD true\nSTOPSIGNAL SIGTERM\nRUN true\n",
    "RUN flags and exec form":
      'FROM --platform=linux/amd64 x:1 AS y\nRUN --mount=type=cache,target=/root/.cache pip install a\nRUN ["echo", "hi"]\n',
    "escapes in arguments": "FROM x\nRUN printf 'a\\tb\\n' && echo \\$HOME \\\\ done\nRUN echo a\\ b\n",
    "the escape directive": "# escape=`\nFROM x\nRUN echo a `\n  b\nCOPY a.txt c:\\dest\\\n",
    "a syntax directive": "# syntax=docker/dockerfile:1\n\nFROM x\nRUN echo hi\n",
    "lower-case instructions": "from x\nrun echo hi\nworkdir /w\ncmd run\n",
    "a heredoc": "FROM x\nRUN <<EOF\necho a\necho b\nEOF\nRUN echo after\n",
    "CRLF line endings": 'FROM x\r\nRUN echo a \\\r\n  b\r\nCMD ["a"]\r\n',
    "no newline at the end": "FROM x\nRUN echo last",
    "FROM without an image": "FROM\nRUN true\n",
    "only a FROM": "FROM scratch\n",
  };
  beforeAll(() => {
    vi.spyOn(console, "warn").mockImplementation(() => undefined);
  });
  for (const [name, dockerfile] of Object.entries(dockerfiles)) {
    test(name, async () => {
      const outcome = await expectSame((t) => t.fromDockerfile(dockerfile));
      expect(outcome).toHaveProperty("json");
    });
  }

  test("a Dockerfile path is read; skipCache before it forces the steps and the template", async () => {
    const dir = mkdtempSync(join(tmpdir(), "warren-dockerfile-"));
    mkdirSync(join(dir, "sub"));
    const path = join(dir, "sub", "Dockerfile");
    writeFileSync(path, "FROM python:3\nCOPY a.txt /a\nRUN pip install x\n");
    try {
      await expectSame((t) => t.fromDockerfile(path));
      await expectSame((t) => t.skipCache().fromDockerfile(path));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("unsupported instructions are reported and skipped", () => {
    const warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    warren.Template({ fileContextPath: ctx }).fromDockerfile("FROM x\nLABEL a=b\nRUN true\n");
    expect(warn).toHaveBeenCalledWith("Unsupported instruction: LABEL");
  });
});

describe("filesHash test vectors (E2B-TEMPLATES.md §4.2)", () => {
  const hashOf = async (t: TemplateClass) =>
    (JSON.parse(await warren.Template.toJSON(t)).steps[0] as { filesHash: string }).filesHash;

  test("copy('hello.txt', '/app/') of `hello\\n`, mode 0644", async () => {
    const t = warren.Template({ fileContextPath: ctx }).fromImage("ubuntu:22.04").copy("hello.txt", "/app/");
    expect(await hashOf(t)).toBe("4dd5aecb721a41a82cbb86b502c4bd814c9538f673dbf53143e5ac5f64efd2f4");
  });

  test("copy('link-to-a', '/app/'), a symlink to a.txt", async () => {
    const t = warren.Template({ fileContextPath: ctx }).fromImage("x").copy("link-to-a", "/app/");
    expect(await hashOf(t)).toBe("ca5a9ed59db1b309e6ac0dbe156e52c5f851de2b8835c8e33d2ecd6345b2e3df");
  });
});

describe("the default context directory", () => {
  test("is the directory of the file that called Template()", () => {
    const t = warren.Template() as warren.TemplateBase;
    expect(t.fileContextPath).toBe(import.meta.dirname);
  });
});

describe("ready commands are E2B's strings", () => {
  test("each helper", () => {
    const pairs: [unknown, unknown][] = [
      [warren.waitForPort(8000), e2b.waitForPort(8000)],
      [warren.waitForURL("http://x/a b"), e2b.waitForURL("http://x/a b")],
      [warren.waitForURL("http://x", 301), e2b.waitForURL("http://x", 301)],
      [warren.waitForProcess("node"), e2b.waitForProcess("node")],
      [warren.waitForFile("/tmp/it's"), e2b.waitForFile("/tmp/it's")],
      [warren.waitForTimeout(65_432), e2b.waitForTimeout(65_432)],
    ];
    for (const [ours, theirs] of pairs) {
      expect((ours as warren.ReadyCmd).getCmd()).toBe((theirs as e2b.ReadyCmd).getCmd());
    }
    expect(warren.waitForPort(8000).getCmd()).toBe('[ -n "$(ss -Htuln sport = :8000)" ]');
  });
});
