import { create } from "@bufbuild/protobuf";
import { type StartRequest, StartRequestSchema } from "@warren/proto/process/process_pb";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../config.js";
import { EnvdError } from "../errors.js";
import { SandboxState } from "../state.js";
import type { SandboxUser } from "../users.js";
import { PRLIMIT, planSpawn, SETPRIV } from "./spawn-plan.js";

const ROOT: SandboxUser = { name: "root", uid: 0, gid: 0, home: "/root", groups: [0] };
const USER: SandboxUser = { name: "user", uid: 1001, gid: 1001, home: "/tmp", groups: [1001, 27] };
const PATH = "/usr/bin:/bin";

function request(init: Parameters<typeof create<typeof StartRequestSchema>>[1]): StartRequest {
  return create(StartRequestSchema, init);
}

function state(): SandboxState {
  const sandbox = new SandboxState(loadConfig([], {}));
  sandbox.replaceUserEnv({ SHARED: "sandbox", HOME: "/sandbox-home" });
  return sandbox;
}

async function rejection(promise: Promise<unknown>): Promise<EnvdError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(EnvdError);
  return error as EnvdError;
}

describe("planSpawn", () => {
  it("runs root's commands directly and other users' behind setpriv with their uid, gid and groups", async () => {
    const asRoot = await planSpawn(request({ process: { cmd: "sh", args: ["-c", "id"] } }), ROOT, state(), PATH);
    expect(asRoot.file).toMatch(/\/sh$/);
    expect(asRoot.args).toEqual(["-c", "id"]);

    const asUser = await planSpawn(request({ process: { cmd: "sh", args: ["-c", "id"] } }), USER, state(), PATH);
    expect(asUser.file).toBe(SETPRIV);
    expect(asUser.args).toEqual(["--reuid=1001", "--regid=1001", "--init-groups", "--", asRoot.file, "-c", "id"]);
  });

  it("with a process limit, prlimit sets it (soft and hard) before setpriv drops to the user", async () => {
    const plan = await planSpawn(request({ process: { cmd: "sh", args: ["-c", "id"] } }), USER, state(), PATH, {}, 896);
    expect(plan.file).toBe(PRLIMIT);
    expect(plan.args.slice(0, 3)).toEqual(["--nproc=896:896", "--", SETPRIV]);
    const asRoot = await planSpawn(request({ process: { cmd: "sh" } }), ROOT, state(), PATH, {}, 896);
    expect(asRoot.file).toBe(PRLIMIT);
    expect(asRoot.args).toEqual(["--nproc=896:896", "--", plan.args.at(-3)]);
  });

  it("with envd's launcher: one exec sets the limit, the user's groups, gid and uid; root without a limit runs directly", async () => {
    const LAUNCHER = "/opt/warren/envd/dist/warren-exec";
    const sh = (await planSpawn(request({ process: { cmd: "sh" } }), ROOT, state(), PATH)).file;
    const asUser = await planSpawn(
      request({ process: { cmd: "sh", args: ["-c", "id"] } }),
      USER,
      state(),
      PATH,
      {},
      896,
      LAUNCHER,
    );
    expect(asUser.file).toBe(LAUNCHER);
    expect(asUser.args).toEqual(["--nproc=896", "--uid=1001", "--gid=1001", "--groups=1001,27", "--", sh, "-c", "id"]);
    const unlimited = await planSpawn(
      request({ process: { cmd: "sh" } }),
      USER,
      state(),
      PATH,
      {},
      undefined,
      LAUNCHER,
    );
    expect(unlimited.args).toEqual(["--uid=1001", "--gid=1001", "--groups=1001,27", "--", sh]);
    const rootLimited = await planSpawn(request({ process: { cmd: "sh" } }), ROOT, state(), PATH, {}, 896, LAUNCHER);
    expect([rootLimited.file, ...rootLimited.args]).toEqual([LAUNCHER, "--nproc=896", "--", sh]);
    const rootDirect = await planSpawn(
      request({ process: { cmd: "sh" } }),
      ROOT,
      state(),
      PATH,
      {},
      undefined,
      LAUNCHER,
    );
    expect([rootDirect.file, ...rootDirect.args]).toEqual([sh]);
  });

  it("builds the environment from the user, then the sandbox, then the request, and nothing else", async () => {
    const plan = await planSpawn(
      request({ process: { cmd: "true", envs: { SHARED: "request", ONLY: "x" } } }),
      USER,
      state(),
      PATH,
    );
    expect(plan.env).toEqual({
      PATH,
      HOME: "/sandbox-home",
      USER: "user",
      LOGNAME: "user",
      E2B_SANDBOX: "true",
      SHARED: "request",
      ONLY: "x",
    });
  });

  it("takes the cwd from the request (relative to the home), else the sandbox default, else the home", async () => {
    const sandbox = state();
    expect((await planSpawn(request({ process: { cmd: "true" } }), USER, sandbox, PATH)).cwd).toBe("/tmp");
    expect((await planSpawn(request({ process: { cmd: "true", cwd: "/" } }), USER, sandbox, PATH)).cwd).toBe("/");
    sandbox.defaultWorkdir = "/usr";
    expect((await planSpawn(request({ process: { cmd: "true" } }), USER, sandbox, PATH)).cwd).toBe("/usr");
    expect((await planSpawn(request({ process: { cmd: "true", cwd: "." } }), USER, sandbox, PATH)).cwd).toBe("/tmp");
    const missing = await rejection(planSpawn(request({ process: { cmd: "true", cwd: "nope" } }), USER, sandbox, PATH));
    expect(missing.rawMessage).toBe("cwd '/tmp/nope' does not exist");
  });

  it("opens stdin unless the request says false, and gives a pty 80x24 unless it names a size", async () => {
    const sandbox = state();
    expect((await planSpawn(request({ process: { cmd: "true" } }), ROOT, sandbox, PATH)).stdin).toBe(true);
    expect((await planSpawn(request({ process: { cmd: "true" }, stdin: false }), ROOT, sandbox, PATH)).stdin).toBe(
      false,
    );
    const pty = await planSpawn(request({ process: { cmd: "true" }, pty: {} }), ROOT, sandbox, PATH);
    expect(pty.pty).toEqual({ cols: 80, rows: 24 });
    const sized = await planSpawn(
      request({ process: { cmd: "true" }, pty: { size: { cols: 100 } } }),
      ROOT,
      sandbox,
      PATH,
    );
    expect(sized.pty).toEqual({ cols: 100, rows: 24 });
  });

  it("rejects commands it cannot run, naming them", async () => {
    const sandbox = state();
    const plan = (cmd: string) => planSpawn(request({ process: { cmd } }), ROOT, sandbox, PATH);
    expect((await rejection(plan(""))).rawMessage).toBe("command must not be empty");
    expect((await rejection(plan("no-such-tool"))).rawMessage).toBe(
      "failed to start command 'no-such-tool': executable file not found in $PATH",
    );
    expect((await rejection(plan("/etc"))).rawMessage).toContain("failed to start command '/etc'");
    expect((await rejection(plan("/etc/passwd"))).rawMessage).toBe(
      "failed to start command '/etc/passwd': permission denied",
    );
  });
});
