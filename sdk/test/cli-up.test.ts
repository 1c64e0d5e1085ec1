import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { cleanEnv, eventually, isAlive, processTree, startWarren, warren } from "./cli-harness.js";

// `warren up --detach` / `status` / `down` on a cluster of its own, in its own data dir, with its own
// instance names (netns `warren-cua-*`) and address range.
const dataDir = mkdtempSync(join(tmpdir(), "warren-cli-up-"));
const env = cleanEnv();
const dirFlag = ["--data-dir", dataDir];
const upFlags = [
  "--detach",
  ...dirFlag,
  "--api-port",
  "0",
  "--proxy-port",
  "0",
  "--pool-size",
  "1",
  "--instance-prefix",
  "cu",
  "--node-cidr",
  "10.212.4.0/22",
];

const netnsOfCluster = () =>
  execFileSync("ip", ["netns", "list"], { encoding: "utf8" })
    .split("\n")
    .filter((line) => line.startsWith("warren-cua-"));
const mountsUnder = (dir: string) =>
  readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter((line) => line.includes(dir));

afterAll(async () => {
  // Whatever a failed test left running is stopped the way a user would.
  await warren(["down", ...dirFlag], env, 180_000);
  rmSync(dataDir, { recursive: true, force: true });
}, 240_000);

describe("warren up --detach, status, down", () => {
  it("up --detach returns once the cluster is ready, records its pid, and the cluster serves sandboxes", async () => {
    const up = await warren(["up", ...upFlags, "--json"], env, 900_000);
    expect(up.code, up.stderr).toBe(0);
    const started = JSON.parse(up.stdout) as { running: boolean; pid: number; apiUrl: string; envFile: string };
    expect(started.running).toBe(true);
    expect(readFileSync(join(dataDir, "warren.pid"), "utf8").trim()).toBe(String(started.pid));
    expect(isAlive(started.pid)).toBe(true);
    expect(readFileSync(started.envFile, "utf8")).toContain(`E2B_API_URL=${started.apiUrl}`);

    const status = await warren(["status", ...dirFlag, "--json"], env);
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({
      running: true,
      pid: started.pid,
      api: "up",
      nodes: [{ id: "node-cua", state: "up" }],
    });

    const again = await warren(["up", ...upFlags], env);
    expect(again.code).toBe(0);
    expect(again.stderr).toContain(`already running (pid ${started.pid}`);

    const sandbox = await warren(["sandbox", "create", ...dirFlag], env);
    expect(sandbox.code, sandbox.stderr).toBe(0);
    const exec = await warren(["sandbox", "exec", ...dirFlag, sandbox.stdout.trim(), "--", "true"], env);
    expect(exec.code).toBe(0);
  }, 960_000);

  it("down stops everything: no process of the cluster, no network namespace, no mount, no pid file", async () => {
    const pid = Number(readFileSync(join(dataDir, "warren.pid"), "utf8").trim());
    const tree = processTree(pid);
    expect(tree.length).toBeGreaterThan(5); // launcher, postgres, redis, master, api, node agent, proxy, ...
    expect(netnsOfCluster().length).toBeGreaterThan(0);
    expect(mountsUnder(dataDir).length).toBeGreaterThan(0);

    const down = await warren(["down", ...dirFlag], env, 180_000);
    expect(down.code, down.stderr).toBe(0);
    expect(down.stderr).toContain("Warren stopped");

    expect(tree.filter(isAlive)).toEqual([]);
    expect(netnsOfCluster()).toEqual([]);
    expect(mountsUnder(dataDir)).toEqual([]);
    expect(existsSync(join(dataDir, "warren.pid"))).toBe(false);

    const status = await warren(["status", ...dirFlag], env);
    expect(status.code).toBe(3);
    expect(status.stdout).toContain("Warren is not running");
    const downAgain = await warren(["down", ...dirFlag], env);
    expect(downAgain).toMatchObject({ code: 0, stdout: "Warren is not running\n" });
  }, 240_000);
});

describe("warren up in the foreground, and a failed start", () => {
  const fgDir = mkdtempSync(join(tmpdir(), "warren-cli-fg-"));
  const failDir = mkdtempSync(join(tmpdir(), "warren-cli-fail-"));
  afterAll(async () => {
    await warren(["down", "--data-dir", fgDir], env, 180_000);
    rmSync(fgDir, { recursive: true, force: true });
    rmSync(failDir, { recursive: true, force: true });
  }, 240_000);

  it("up without --detach serves until Ctrl-C, then stops everything and exits 0", async () => {
    const flags = upFlags.filter((flag) => flag !== "--detach").map((flag) => (flag === dataDir ? fgDir : flag));
    const fg = startWarren(["up", ...flags], env);
    await eventually(() => (fg.output().stdout.includes("Ctrl-C stops it") ? true : undefined));
    const pid = Number(readFileSync(join(fgDir, "warren.pid"), "utf8").trim());
    const tree = processTree(pid);
    expect(tree.length).toBeGreaterThan(5);
    expect((await warren(["status", "--data-dir", fgDir], env)).code).toBe(0);

    fg.child.kill("SIGINT");
    const end = await fg.done;
    expect(end.code, end.stderr).toBe(0);
    expect(end.stderr).toContain("warren: stopped");
    expect(tree.filter(isAlive)).toEqual([]);
    expect(netnsOfCluster()).toEqual([]);
    expect(existsSync(join(fgDir, "warren.pid"))).toBe(false);
  }, 960_000);

  it("a cluster that cannot start exits 1 with the cause and a hint to the logs, and leaves no launcher", async () => {
    const res = await warren(
      ["up", "--detach", "--data-dir", failDir, "--api-port", "0", "--proxy-port", "0"],
      { ...env, WARREN_DATABASE_URL: "postgres://postgres@127.0.0.1:9/none" },
      180_000,
    );
    expect(res.code).toBe(1);
    expect(res.stderr).toContain("warren: Warren failed to start");
    expect(res.stderr).toContain("ECONNREFUSED 127.0.0.1:9");
    expect(res.stderr).toContain(`hint: see the logs in ${failDir}/logs`);
    expect(existsSync(join(failDir, "warren.pid"))).toBe(false);
    expect((await warren(["status", "--data-dir", failDir], env)).code).toBe(3);
  }, 240_000);
});
