import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { scratchName, startTestEnvd, type TestEnvd } from "./harness.js";

const HOME = "/home/user";
const USER_UID = Number(execFileSync("id", ["-u", "user"]).toString().trim());
const USER_GID = Number(execFileSync("id", ["-g", "user"]).toString().trim());

async function errorOf(res: Response): Promise<{ status: number; code: unknown; message: string }> {
  const body = (await res.json()) as { code: unknown; message: string };
  return { status: res.status, code: body.code, message: body.message };
}

function compose(envd: TestEnvd, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${envd.url}/files/compose`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** Writes `content` at `path` owned by the test user, as a file of theirs would be. */
function userFile(path: string, content: string): string {
  writeFileSync(path, content);
  execFileSync("chown", ["user:user", path]);
  return path;
}

function leftoverTemporaries(dir: string): string[] {
  return readdirSync(dir).filter((name) => name.includes(".e2b-compose."));
}

describe("POST /files/compose", () => {
  let envd: TestEnvd;
  let dir: string;
  let abs: string;
  const rootDir = `/tmp/${scratchName("compose-root")}`;

  beforeAll(async () => {
    envd = await startTestEnvd();
    dir = scratchName("compose");
    abs = `${HOME}/${dir}`;
    mkdirSync(abs);
    execFileSync("chown", ["user:user", abs]);
    mkdirSync(rootDir, { mode: 0o755 });
    chmodSync(rootDir, 0o755);
  });

  afterAll(async () => {
    rmSync(abs, { recursive: true, force: true });
    rmSync(rootDir, { recursive: true, force: true });
    await envd?.stop();
  });

  test("three sources are concatenated in order, removed, and the destination belongs to the user", async () => {
    const a = userFile(`${abs}/part-a`, "alpha,");
    userFile(`${abs}/part-b`, "beta,");
    const c = userFile(`${abs}/part-c`, "gamma");
    const res = await compose(envd, {
      destination: `~/${dir}/whole.txt`,
      source_paths: [a, `${dir}/part-b`, `~/${dir}/part-c`],
      username: "user",
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    expect(await res.json()).toEqual({ path: `${abs}/whole.txt`, name: "whole.txt", type: "file" });
    expect(readFileSync(`${abs}/whole.txt`, "utf8")).toBe("alpha,beta,gamma");
    for (const source of [a, `${abs}/part-b`, c]) expect(existsSync(source)).toBe(false);
    const info = statSync(`${abs}/whole.txt`);
    expect({ uid: info.uid, gid: info.gid, mode: info.mode & 0o7777 }).toEqual({
      uid: USER_UID,
      gid: USER_GID,
      mode: 0o644,
    });
    expect(leftoverTemporaries(abs)).toEqual([]);
  });

  test("without a username the default user composes, and one info line names path, sources and size", async () => {
    const a = userFile(`${abs}/log-a`, "12345");
    const b = userFile(`${abs}/log-b`, "678");
    const res = await compose(envd, { destination: `${abs}/log.txt`, source_paths: [a, b] });
    expect(res.status).toBe(200);
    expect(statSync(`${abs}/log.txt`).uid).toBe(USER_UID);
    const line = envd
      .logs()
      .split("\n")
      .find((text) => text.includes('"files composed"') && text.includes(`${abs}/log.txt`));
    expect(line).toBeDefined();
    expect(JSON.parse(line as string)).toMatchObject({ level: "info", path: `${abs}/log.txt`, sources: 2, size: 8 });
  });

  test("missing parent directories of the destination are created, owned by the user", async () => {
    const a = userFile(`${abs}/nested-a`, "x");
    const res = await compose(envd, { destination: `${abs}/new/deeper/out.bin`, source_paths: [a] });
    expect(res.status).toBe(200);
    expect(readFileSync(`${abs}/new/deeper/out.bin`, "utf8")).toBe("x");
    for (const created of [`${abs}/new`, `${abs}/new/deeper`]) {
      const info = statSync(created);
      expect({ dir: info.isDirectory(), uid: info.uid, mode: info.mode & 0o777 }).toEqual({
        dir: true,
        uid: USER_UID,
        mode: 0o755,
      });
    }
  });

  test("a missing source is 404 and the existing destination and the other sources stay as they were", async () => {
    const destination = userFile(`${abs}/kept.txt`, "old content");
    const a = userFile(`${abs}/keep-a`, "A");
    const c = userFile(`${abs}/keep-c`, "C");
    const res = await compose(envd, { destination, source_paths: [a, `${abs}/keep-missing`, c] });
    expect(await errorOf(res)).toEqual({
      status: 404,
      code: 404,
      message: `source file not found: ${abs}/keep-missing`,
    });
    expect(readFileSync(destination, "utf8")).toBe("old content");
    expect(readFileSync(a, "utf8")).toBe("A");
    expect(readFileSync(c, "utf8")).toBe("C");
    expect(leftoverTemporaries(abs)).toEqual([]);

    const replaced = await compose(envd, { destination, source_paths: [a, c] });
    expect(replaced.status).toBe(200);
    expect(readFileSync(destination, "utf8")).toBe("AC");
    expect(leftoverTemporaries(abs)).toEqual([]);
  });

  test("26 sources keep their order and envd logs no listener-leak warning", async () => {
    const sources = Array.from({ length: 25 }, (_, i) => userFile(`${abs}/many-${i}`, `${i};`));
    const big = userFile(`${abs}/many-big`, "z".repeat(3 * 1024 * 1024));
    const res = await compose(envd, { destination: `${abs}/many.txt`, source_paths: [...sources, big] });
    expect(res.status).toBe(200);
    const content = readFileSync(`${abs}/many.txt`, "utf8");
    const expectedHead = Array.from({ length: 25 }, (_, i) => `${i};`).join("");
    expect(content.length).toBe(expectedHead.length + 3 * 1024 * 1024);
    expect(content.startsWith(expectedHead)).toBe(true);
    expect(envd.logs()).not.toContain("MaxListenersExceededWarning");
  });

  test("a full disk is 507 and the existing destination, the sources and no temporary file remain", async () => {
    const mount = `/tmp/${scratchName("compose-full")}`;
    mkdirSync(mount);
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", mount]);
    try {
      const destination = `${mount}/kept.bin`;
      writeFileSync(destination, "old");
      const a = userFile(`${abs}/full-a`, "a".repeat(768 * 1024));
      const b = userFile(`${abs}/full-b`, "b".repeat(768 * 1024));
      const res = await compose(envd, { destination, source_paths: [a, b], username: "root" });
      expect(await errorOf(res)).toEqual({ status: 507, code: 507, message: "not enough disk space available" });
      expect(readFileSync(destination, "utf8")).toBe("old");
      expect(readdirSync(mount)).toEqual(["kept.bin"]);
      expect(statSync(a).size + statSync(b).size).toBe(2 * 768 * 1024);
    } finally {
      execFileSync("umount", [mount]);
      rmSync(mount, { recursive: true, force: true });
    }
  });

  test("an empty source_paths is 400", async () => {
    const res = await compose(envd, { destination: `${abs}/empty.txt`, source_paths: [] });
    expect(await errorOf(res)).toEqual({ status: 400, code: 400, message: "source_paths must not be empty" });
  });

  test("a missing destination is 400", async () => {
    const a = userFile(`${abs}/nodest-a`, "a");
    const res = await compose(envd, { source_paths: [a] });
    expect(await errorOf(res)).toEqual({ status: 400, code: 400, message: "destination is required" });
    expect(existsSync(a)).toBe(true);
  });

  test("a source equal to the destination is 400 and nothing changes", async () => {
    const a = userFile(`${abs}/same-a`, "a");
    const b = userFile(`${abs}/same-b`, "b");
    const res = await compose(envd, { destination: b, source_paths: [a, `${dir}/same-b`] });
    expect(await errorOf(res)).toEqual({
      status: 400,
      code: 400,
      message: `source path '${dir}/same-b' cannot be the same as destination`,
    });
    expect(readFileSync(a, "utf8")).toBe("a");
    expect(readFileSync(b, "utf8")).toBe("b");
  });

  test("a directory as a source is 400 and nothing changes", async () => {
    const a = userFile(`${abs}/dirsrc-a`, "a");
    mkdirSync(`${abs}/dirsrc`);
    const res = await compose(envd, { destination: `${abs}/dirsrc.out`, source_paths: [a, `${abs}/dirsrc`] });
    expect(await errorOf(res)).toEqual({
      status: 400,
      code: 400,
      message: `source path is not a regular file: ${abs}/dirsrc`,
    });
    expect(existsSync(a)).toBe(true);
    expect(existsSync(`${abs}/dirsrc.out`)).toBe(false);
  });

  test("a body that is not JSON is 400", async () => {
    const res = await compose(envd, "{not json");
    const error = await errorOf(res);
    expect({ status: error.status, code: error.code }).toEqual({ status: 400, code: 400 });
    expect(error.message).toMatch(/^request body is not valid JSON/);
  });

  test("source_paths that is not an array of strings is 400", async () => {
    const res = await compose(envd, { destination: `${abs}/typed.txt`, source_paths: "a" });
    expect(await errorOf(res)).toEqual({
      status: 400,
      code: 400,
      message: "invalid request body: source_paths must be an array of strings",
    });
  });

  test("an unknown username is 401 'error looking up user' and nothing changes", async () => {
    const a = userFile(`${abs}/unknown-a`, "a");
    const res = await compose(envd, { destination: `${abs}/unknown.txt`, source_paths: [a], username: "no-such-user" });
    const error = await errorOf(res);
    expect(error.status).toBe(401);
    expect(error.message).toMatch(/^error looking up user 'no-such-user': /);
    expect(existsSync(a)).toBe(true);
    expect(existsSync(`${abs}/unknown.txt`)).toBe(false);
  });

  test("a source the user may not read is 403 naming it, and nothing changes", async () => {
    const a = userFile(`${abs}/secret-a`, "a");
    const secret = `${abs}/secret-root`;
    writeFileSync(secret, "root only", { mode: 0o600 });
    chmodSync(secret, 0o600);
    const destination = userFile(`${abs}/secret.txt`, "before");
    const res = await compose(envd, { destination, source_paths: [a, secret], username: "user" });
    const error = await errorOf(res);
    expect({ status: error.status, code: error.code }).toEqual({ status: 403, code: 403 });
    expect(error.message).toContain(secret);
    expect(readFileSync(a, "utf8")).toBe("a");
    expect(readFileSync(secret, "utf8")).toBe("root only");
    expect(readFileSync(destination, "utf8")).toBe("before");
    expect(leftoverTemporaries(abs)).toEqual([]);
  });

  test("a source the user may read but not remove is 403 and nothing changes", async () => {
    const readable = `${rootDir}/readable.txt`;
    writeFileSync(readable, "shared");
    chmodSync(readable, 0o644);
    const res = await compose(envd, { destination: `${abs}/shared.txt`, source_paths: [readable], username: "user" });
    const error = await errorOf(res);
    expect(error.status).toBe(403);
    expect(error.message).toContain(rootDir);
    expect(readFileSync(readable, "utf8")).toBe("shared");
    expect(existsSync(`${abs}/shared.txt`)).toBe(false);
  });

  test("the destination is written like an upload: into root's directory, handed to the user (E2B)", async () => {
    const a = userFile(`${abs}/nowrite-a`, "a");
    const destination = `${rootDir}/made/out.txt`;
    const res = await compose(envd, { destination, source_paths: [a], username: "user" });
    expect(res.status).toBe(200);
    expect(readFileSync(destination, "utf8")).toBe("a");
    expect(statSync(destination).uid).toBe(statSync(HOME).uid);
    expect(statSync(`${rootDir}/made`)).toMatchObject({ uid: statSync(HOME).uid, mode: 0o40755 });
    expect(existsSync(a)).toBe(false);
    expect(leftoverTemporaries(`${rootDir}/made`)).toEqual([]);
  });

  test("root may compose anywhere and owns the result", async () => {
    const a = `${rootDir}/root-a`;
    writeFileSync(a, "r");
    const res = await compose(envd, { destination: `${rootDir}/root-out`, source_paths: [a], username: "root" });
    expect(res.status).toBe(200);
    expect(statSync(`${rootDir}/root-out`).uid).toBe(0);
    expect(existsSync(a)).toBe(false);
  });
});

describe("POST /files/compose on a secured envd", () => {
  const token = `tok-${scratchName("compose")}`;
  let envd: TestEnvd;
  let abs: string;

  beforeAll(async () => {
    envd = await startTestEnvd({ accessToken: token });
    abs = `${HOME}/${scratchName("compose-auth")}`;
    mkdirSync(abs);
    execFileSync("chown", ["user:user", abs]);
  });

  afterAll(async () => {
    rmSync(abs, { recursive: true, force: true });
    await envd?.stop();
  });

  test("without X-Access-Token, or with a wrong one, the answer is 401 and nothing changes", async () => {
    const a = userFile(`${abs}/a`, "a");
    const body = { destination: `${abs}/out.txt`, source_paths: [a] };
    for (const headers of [{}, { "X-Access-Token": "wrong" }]) {
      const res = await compose(envd, body, headers);
      const error = await errorOf(res);
      expect({ status: error.status, code: error.code }).toEqual({ status: 401, code: 401 });
    }
    expect(existsSync(a)).toBe(true);
    expect(existsSync(`${abs}/out.txt`)).toBe(false);
    const ok = await compose(envd, body, { "X-Access-Token": token });
    expect(ok.status).toBe(200);
    expect(readFileSync(`${abs}/out.txt`, "utf8")).toBe("a");
    expect(envd.logs()).not.toContain(token);
  });
});
