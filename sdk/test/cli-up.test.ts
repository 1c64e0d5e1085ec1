import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTestCertificates } from "@warren/local/test-certificates";
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

  it("up without --detach, with --domain and a certificate, serves E2B's domain layout over TLS until Ctrl-C, then stops everything and exits 0", async () => {
    const domain = "warren.test"; // RFC 2606: never a real domain
    const tls = makeTestCertificates(join(fgDir, "tls"), domain);
    const flags = upFlags.filter((flag) => flag !== "--detach").map((flag) => (flag === dataDir ? fgDir : flag));
    const tlsFlags = ["--domain", domain, "--tls-cert", tls.certFile, "--tls-key", tls.keyFile, "--tls-ca", tls.caFile];
    const fg = startWarren(["up", ...flags, ...tlsFlags], env);
    await eventually(() => (fg.output().stdout.includes("Ctrl-C stops it") ? true : undefined));
    const pid = Number(readFileSync(join(fgDir, "warren.pid"), "utf8").trim());
    const tree = processTree(pid);
    expect(tree.length).toBeGreaterThan(5);
    expect((await warren(["status", "--data-dir", fgDir], env)).code).toBe(0);
    // The SDK's only setting is E2B_DOMAIN (`<domain>:<proxy port>`); api.<domain> reaches the api through the proxy.
    const clientDomain = /export E2B_DOMAIN=(\S+)/.exec(fg.output().stdout)?.[1] ?? "";
    expect(clientDomain).toMatch(/^warren\.test:\d+$/);
    expect(readFileSync(join(fgDir, "env"), "utf8")).toContain(`E2B_DOMAIN=${clientDomain}`);
    const health = await httpsStatus(`api.${clientDomain}`, "/health", readFileSync(tls.caFile));
    expect(health).toBe(200);

    fg.child.kill("SIGINT");
    const end = await fg.done;
    expect(end.code, end.stderr).toBe(0);
    expect(end.stderr).toContain("warren: stopped");
    expect(tree.filter(isAlive)).toEqual([]);
    expect(netnsOfCluster()).toEqual([]);
    expect(existsSync(join(fgDir, "warren.pid"))).toBe(false);
  }, 960_000);

  it("--domain without a certificate, or a name that is not a domain, is a usage error before anything starts", async () => {
    const missing = await warren(["up", "--detach", "--data-dir", failDir, "--domain", "warren.test"], env);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("--domain, --tls-cert and --tls-key go together");
    const bad = await warren(
      [
        "up",
        "--detach",
        "--data-dir",
        failDir,
        "--domain",
        "not a domain",
        "--tls-cert",
        "/etc/hostname",
        "--tls-key",
        "/etc/hostname",
      ],
      env,
    );
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--domain 'not a domain' is not a domain name");
    const absent = await warren(
      [
        "up",
        "--detach",
        "--data-dir",
        failDir,
        "--domain",
        "warren.test",
        "--tls-cert",
        "/nonexistent.pem",
        "--tls-key",
        "/etc/hostname",
      ],
      env,
    );
    expect(absent.code).toBe(2);
    expect(absent.stderr).toContain("--tls-cert /nonexistent.pem: no such file");
    expect(existsSync(join(failDir, "warren.pid"))).toBe(false);
  });

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

/** The status of GET `path` at `host` (`name:port`) over TLS, connecting to loopback and trusting `ca`. */
function httpsStatus(host: string, path: string, ca: Buffer): Promise<number> {
  const [name, port] = host.split(":") as [string, string];
  return new Promise((resolve, reject) => {
    const req = request(
      { host: "127.0.0.1", port: Number(port), path, servername: name, headers: { host }, ca, timeout: 10_000 },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    req.on("error", reject);
    req.end();
  });
}
