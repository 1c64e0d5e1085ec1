import { execFileSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { EventType, Filesystem, FileType } from "@warren/proto/filesystem/filesystem_pb";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { scratchName, startTestEnvd, type TestEnvd } from "./harness.js";

const HOME = "/home/user";
const AS_USER = { authorization: `Basic ${Buffer.from("user:").toString("base64")}` };
const AS_ROOT = { authorization: `Basic ${Buffer.from("root:").toString("base64")}` };

function filesystemClient(envd: TestEnvd): Client<typeof Filesystem> {
  return createClient(Filesystem, createConnectTransport({ baseUrl: envd.url, httpVersion: "1.1" }));
}

/** The pids of live inotifywait processes whose arguments include `path`. */
function inotifywaitFor(path: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let args: string[];
    try {
      args = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
    } catch {
      continue;
    }
    if (args[0]?.endsWith("inotifywait") && args.includes(path)) pids.push(Number(entry));
  }
  return pids;
}

/** Polls `condition` until it holds; the test's own timeout bounds the wait. */
async function until(condition: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await condition())) await sleep(25);
}

async function codeOf(call: Promise<unknown>): Promise<{ code: Code; message: string }> {
  try {
    await call;
  } catch (error) {
    const connect = ConnectError.from(error);
    return { code: connect.code, message: connect.rawMessage };
  }
  throw new Error("expected the call to fail");
}

describe("filesystem.Filesystem over Connect", () => {
  let envd: TestEnvd;
  let fs: Client<typeof Filesystem>;
  let abs: string;
  const rootDir = `/root/${scratchName("private")}`;

  beforeAll(async () => {
    envd = await startTestEnvd();
    fs = filesystemClient(envd);
    abs = `${HOME}/${scratchName("rpc")}`;
    mkdirSync(abs);
    execFileSync("chown", ["user:user", abs]);
    mkdirSync(rootDir, { mode: 0o700 });
    writeFileSync(`${rootDir}/secret.txt`, "s");
  });

  afterAll(async () => {
    rmSync(abs, { recursive: true, force: true });
    rmSync(rootDir, { recursive: true, force: true });
    await envd?.stop();
  });

  test("Stat of a file under /root as user is permission_denied naming the path", async () => {
    const error = await codeOf(fs.stat({ path: `${rootDir}/secret.txt` }, { headers: AS_USER }));
    expect(error.code).toBe(Code.PermissionDenied);
    expect(error.message).toContain("/root");
    const asRoot = await fs.stat({ path: `${rootDir}/secret.txt` }, { headers: AS_ROOT });
    expect(asRoot.entry?.owner).toBe("root");
  });

  test("ListDir of a root-only directory is denied to user and allowed to root", async () => {
    expect((await codeOf(fs.listDir({ path: rootDir, depth: 1 }, { headers: AS_USER }))).code).toBe(
      Code.PermissionDenied,
    );
    const listed = await fs.listDir({ path: rootDir, depth: 1 }, { headers: AS_ROOT });
    expect(listed.entries.map((entry) => entry.name)).toEqual(["secret.txt"]);
  });

  test("Move and Remove of root's entries are denied to user and change nothing", async () => {
    expect((await codeOf(fs.remove({ path: `${rootDir}/secret.txt` }, { headers: AS_USER }))).code).toBe(
      Code.PermissionDenied,
    );
    const move = fs.move({ source: `${rootDir}/secret.txt`, destination: `${abs}/stolen.txt` }, { headers: AS_USER });
    expect((await codeOf(move)).code).toBe(Code.PermissionDenied);
    expect(existsSync(`${rootDir}/secret.txt`)).toBe(true);
    expect(existsSync(`${abs}/stolen.txt`)).toBe(false);
  });

  test("MakeDir needs no permission of the user: root creates the folders and hands them over (E2B)", async () => {
    const res = await fs.makeDir({ path: `${rootDir}/new/deeper` }, { headers: AS_USER });
    expect(res.entry).toMatchObject({ path: `${rootDir}/new/deeper`, owner: "user", group: "user", mode: 0o755 });
    expect(statSync(`${rootDir}/new`)).toMatchObject({ uid: statSync(HOME).uid, mode: 0o40755 });
    expect(statSync(rootDir)).toMatchObject({ uid: 0, mode: 0o40700 });
  });

  test("a Move's destination is a write: the user's file moves into root's folder, its parents created for them", async () => {
    writeFileSync(`${abs}/mine.txt`, "m");
    execFileSync("chown", ["user:user", `${abs}/mine.txt`]);
    const destination = `${rootDir}/moved-in/mine.txt`;
    const res = await fs.move({ source: `${abs}/mine.txt`, destination }, { headers: AS_USER });
    expect(res.entry).toMatchObject({ path: destination, owner: "user" });
    expect(statSync(`${rootDir}/moved-in`)).toMatchObject({ uid: statSync(HOME).uid, mode: 0o40755 });
    expect(existsSync(`${abs}/mine.txt`)).toBe(false);
  });

  test("a denied Move creates none of the destination's folders", async () => {
    const move = fs.move(
      { source: `${rootDir}/secret.txt`, destination: `${abs}/not-made/stolen.txt` },
      { headers: AS_USER },
    );
    expect((await codeOf(move)).code).toBe(Code.PermissionDenied);
    expect(existsSync(`${abs}/not-made`)).toBe(false);
  });

  test("Remove of a tree holding a directory the user may not write is denied and removes nothing", async () => {
    mkdirSync(`${abs}/tree/locked`, { recursive: true });
    writeFileSync(`${abs}/tree/mine.txt`, "m");
    writeFileSync(`${abs}/tree/locked/theirs.txt`, "t");
    execFileSync("chown", ["-R", "user:user", `${abs}/tree`]);
    execFileSync("chown", ["root:root", `${abs}/tree/locked`]);
    const error = await codeOf(fs.remove({ path: `${abs}/tree` }, { headers: AS_USER }));
    expect(error.code).toBe(Code.PermissionDenied);
    expect(error.message).toContain(`${abs}/tree/locked`);
    expect(existsSync(`${abs}/tree/mine.txt`)).toBe(true);
    await fs.remove({ path: `${abs}/tree` }, { headers: AS_ROOT });
    expect(existsSync(`${abs}/tree`)).toBe(false);
  });

  test("a sticky directory keeps user from removing root's file in it", async () => {
    mkdirSync(`${abs}/sticky`);
    chmodSync(`${abs}/sticky`, 0o1777);
    writeFileSync(`${abs}/sticky/roots.txt`, "r");
    expect((await codeOf(fs.remove({ path: `${abs}/sticky/roots.txt` }, { headers: AS_USER }))).code).toBe(
      Code.PermissionDenied,
    );
    const entry = await fs.stat({ path: `${abs}/sticky` }, { headers: AS_USER });
    expect(entry.entry?.permissions).toBe("dtrwxrwxrwx");
  });

  test("MakeDir creates missing parents 0755 owned by the user", async () => {
    const res = await fs.makeDir({ path: `${abs}/p1/p2/p3` }, { headers: AS_USER });
    expect(res.entry).toMatchObject({ name: "p3", type: FileType.DIRECTORY, path: `${abs}/p1/p2/p3`, mode: 0o755 });
    for (const dir of ["p1", "p1/p2", "p1/p2/p3"]) {
      const info = statSync(`${abs}/${dir}`);
      expect(info.uid).toBe(statSync(HOME).uid);
      expect(info.mode & 0o777).toBe(0o755);
    }
  });

  test("MakeDir on an existing directory is already_exists and on a file invalid_argument", async () => {
    writeFileSync(`${abs}/plain.txt`, "x");
    expect((await codeOf(fs.makeDir({ path: abs }, { headers: AS_USER }))).code).toBe(Code.AlreadyExists);
    expect((await codeOf(fs.makeDir({ path: `${abs}/plain.txt` }, { headers: AS_USER }))).code).toBe(
      Code.InvalidArgument,
    );
  });

  test("ListDir of a file is invalid_argument and of a missing path not_found", async () => {
    writeFileSync(`${abs}/list-file.txt`, "x");
    expect((await codeOf(fs.listDir({ path: `${abs}/list-file.txt` }))).code).toBe(Code.InvalidArgument);
    expect((await codeOf(fs.listDir({ path: `${abs}/nope` }))).code).toBe(Code.NotFound);
  });

  test("Move of a missing source is not_found; Remove of a missing path succeeds", async () => {
    expect((await codeOf(fs.move({ source: `${abs}/none`, destination: `${abs}/x` }))).code).toBe(Code.NotFound);
    await fs.remove({ path: `${abs}/none` });
  });

  test("an unknown Basic user is unauthenticated and a NUL byte in a path is invalid_argument", async () => {
    const headers = { authorization: `Basic ${Buffer.from("nobody-here:").toString("base64")}` };
    const unknown = await codeOf(fs.stat({ path: "/" }, { headers }));
    expect(unknown).toEqual({ code: Code.Unauthenticated, message: "invalid username: 'nobody-here'" });
    expect((await codeOf(fs.stat({ path: "a\0b" }))).code).toBe(Code.InvalidArgument);
  });

  test("malformed JSON to an RPC is a 4xx and envd keeps serving", async () => {
    const res = await fetch(`${envd.url}/filesystem.Filesystem/Stat`, {
      method: "POST",
      headers: { "Content-Type": "application/json", "Connect-Protocol-Version": "1" },
      body: "{not json",
    });
    expect(res.status).toBeGreaterThanOrEqual(400);
    expect(res.status).toBeLessThan(500);
    expect((await fs.stat({ path: abs })).entry?.type).toBe(FileType.DIRECTORY);
  });

  test("a body that is not valid protobuf binary is invalid_argument as in JSON, unary and streaming", async () => {
    const garbage = Buffer.from([0xff, 0xff, 0xff]);
    const call = (path: string, contentType: string, body: Buffer, headers: Record<string, string> = {}) =>
      fetch(`${envd.url}/${path}`, {
        method: "POST",
        headers: { "Content-Type": contentType, "Connect-Protocol-Version": "1", ...headers },
        body,
      });
    for (const contentType of ["application/proto", "application/json"]) {
      const res = await call("filesystem.Filesystem/Stat", contentType, garbage);
      expect(res.status).toBe(400);
      expect(((await res.json()) as { code: string }).code).toBe("invalid_argument");
    }
    const truncatedGzip = await call("filesystem.Filesystem/Stat", "application/proto", Buffer.from([0x1f, 0x8b]), {
      "Content-Encoding": "gzip",
    });
    expect(await truncatedGzip.json()).toEqual({
      code: "invalid_argument",
      message: "cannot decompress the filesystem.StatRequest message: it is truncated or corrupt",
    });
    const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, garbage.length]), garbage]);
    for (const [path, contentType] of [
      ["filesystem.Filesystem/WatchDir", "application/connect+proto"],
      ["filesystem.Filesystem/WatchDir", "application/connect+json"],
      ["process.Process/Start", "application/connect+proto"],
    ] as const) {
      const res = await call(path, contentType, envelope);
      const body = Buffer.from(await res.arrayBuffer());
      // One end-stream envelope (flags 0x02) carrying the error.
      expect(body[0]).toBe(2);
      const end = JSON.parse(body.subarray(5).toString()) as { error: { code: string; message: string } };
      expect(end.error.code).toBe("invalid_argument");
      expect(end.error.message).toContain("cannot decode message");
    }
    expect((await fs.stat({ path: abs })).entry?.type).toBe(FileType.DIRECTORY);
  });

  test("ListDir through a symlinked directory keeps the requested path and does not descend into links", async () => {
    mkdirSync(`${abs}/real/sub`, { recursive: true });
    writeFileSync(`${abs}/real/sub/f.txt`, "f");
    symlinkSync(`${abs}/real`, `${abs}/via-link`);
    symlinkSync(`${abs}/real/sub`, `${abs}/real/linked-sub`);
    const res = await fs.listDir({ path: `${abs}/via-link`, depth: 3 });
    expect(res.entries.map((entry) => entry.path)).toEqual([
      `${abs}/via-link/linked-sub`,
      `${abs}/via-link/sub`,
      `${abs}/via-link/sub/f.txt`,
    ]);
    const link = res.entries[0];
    expect(link).toMatchObject({
      type: FileType.DIRECTORY,
      symlinkTarget: `${abs}/real/sub`,
      permissions: "Lrwxrwxrwx",
    });
    const shallow = await fs.listDir({ path: `${abs}/real`, depth: 0 });
    expect(shallow.entries.map((entry) => entry.name)).toEqual(["linked-sub", "sub"]);
  });

  test("a polling watcher buffers events until drained and RemoveWatcher ends its inotifywait", async () => {
    const dir = `${abs}/polled`;
    mkdirSync(dir);
    const { watcherId } = await fs.createWatcher({ path: dir, recursive: true }, { headers: AS_USER });
    expect(inotifywaitFor(dir)).toHaveLength(1);
    writeFileSync(`${dir}/one.txt`, "1");
    const seen: Array<{ name: string; type: EventType }> = [];
    await until(async () => {
      const { events } = await fs.getWatcherEvents({ watcherId });
      seen.push(...events.map(({ name, type }) => ({ name, type })));
      return seen.some((event) => event.name === "one.txt" && event.type === EventType.WRITE);
    });
    expect(seen[0]).toEqual({ name: "one.txt", type: EventType.CREATE });
    await fs.removeWatcher({ watcherId });
    expect(inotifywaitFor(dir)).toEqual([]);
    expect((await codeOf(fs.getWatcherEvents({ watcherId }))).code).toBe(Code.NotFound);
  });

  test("CreateWatcher refuses a missing path, a file and a directory the user may not list", async () => {
    writeFileSync(`${abs}/watch-me.txt`, "x");
    expect((await codeOf(fs.createWatcher({ path: `${abs}/missing` }))).code).toBe(Code.NotFound);
    expect((await codeOf(fs.createWatcher({ path: `${abs}/watch-me.txt` }))).code).toBe(Code.InvalidArgument);
    expect((await codeOf(fs.createWatcher({ path: rootDir }, { headers: AS_USER }))).code).toBe(Code.PermissionDenied);
    expect((await codeOf(fs.removeWatcher({ watcherId: "w-unknown" }))).code).toBe(Code.NotFound);
  });

  test("WatchDir sends start first, sees a file created right after it, and sends keepalives", async () => {
    const dir = `${abs}/streamed`;
    mkdirSync(dir);
    const abort = new AbortController();
    const stream = fs.watchDir(
      { path: dir, includeEntry: true },
      { headers: { ...AS_USER, "Keepalive-Ping-Interval": "1" }, signal: abort.signal },
    );
    const iterator = stream[Symbol.asyncIterator]();
    const first = await iterator.next();
    expect(first.value?.event.case).toBe("start");
    writeFileSync(`${dir}/right-after.txt`, "x");
    let created = false;
    let keepalive = false;
    while (!created || !keepalive) {
      const { value } = await iterator.next();
      if (value?.event.case === "keepalive") keepalive = true;
      if (value?.event.case === "filesystem" && value.event.value.type === EventType.CREATE) {
        expect(value.event.value.name).toBe("right-after.txt");
        expect(value.event.value.entry?.path).toBe(`${dir}/right-after.txt`);
        created = true;
      }
    }
    abort.abort();
    await until(() => inotifywaitFor(dir).length === 0);
  });

  test("WatchDir ends with deadline_exceeded at its Connect-Timeout-Ms and leaves no inotifywait", async () => {
    const dir = `${abs}/deadline`;
    mkdirSync(dir);
    const stream = fs.watchDir({ path: dir }, { timeoutMs: 1500 });
    let failure: ConnectError | undefined;
    try {
      for await (const message of stream) {
        if (message.event.case === "start") expect(inotifywaitFor(dir)).toHaveLength(1);
      }
    } catch (error) {
      failure = ConnectError.from(error);
    }
    expect(failure?.code).toBe(Code.DeadlineExceeded);
    await until(() => inotifywaitFor(dir).length === 0);
  });

  test("a recursive WatchDir hides events from subdirectories the user may not list", async () => {
    const dir = `${abs}/mixed`;
    mkdirSync(`${dir}/hidden`, { recursive: true });
    mkdirSync(`${dir}/open`);
    chmodSync(`${dir}/hidden`, 0o700);
    const abort = new AbortController();
    const names: string[] = [];
    const stream = fs.watchDir({ path: dir, recursive: true }, { headers: AS_USER, signal: abort.signal });
    const iterator = stream[Symbol.asyncIterator]();
    expect((await iterator.next()).value?.event.case).toBe("start");
    writeFileSync(`${dir}/hidden/secret.txt`, "s");
    writeFileSync(`${dir}/open/visible.txt`, "v");
    while (!names.includes("open/visible.txt")) {
      const { value } = await iterator.next();
      if (value?.event.case === "filesystem") names.push(value.event.value.name);
    }
    expect(names.filter((name) => name.startsWith("hidden/"))).toEqual([]);
    abort.abort();
  });

  test("WatchDir of a root-only directory is permission_denied for user", async () => {
    const error = await codeOf(
      (async () => {
        for await (const _ of fs.watchDir({ path: rootDir }, { headers: AS_USER })) break;
      })(),
    );
    expect(error.code).toBe(Code.PermissionDenied);
  });
});

describe("envd shutdown and watchers", () => {
  test("stopping envd kills the inotifywait of every polling watcher and open WatchDir stream", async () => {
    const envd = await startTestEnvd();
    const fs = filesystemClient(envd);
    const dir = `${HOME}/${scratchName("shutdown")}`;
    mkdirSync(`${dir}/polled`, { recursive: true });
    mkdirSync(`${dir}/streamed`);
    try {
      await fs.createWatcher({ path: `${dir}/polled` });
      const stream = fs.watchDir({ path: `${dir}/streamed` })[Symbol.asyncIterator]();
      expect((await stream.next()).value?.event.case).toBe("start");
      expect(inotifywaitFor(`${dir}/polled`)).toHaveLength(1);
      expect(inotifywaitFor(`${dir}/streamed`)).toHaveLength(1);
      const ended = stream.next().then(
        () => undefined,
        (error: unknown) => ConnectError.from(error),
      );
      await envd.stop();
      await ended;
      expect(inotifywaitFor(`${dir}/polled`)).toEqual([]);
      expect(inotifywaitFor(`${dir}/streamed`)).toEqual([]);
    } finally {
      await envd.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
