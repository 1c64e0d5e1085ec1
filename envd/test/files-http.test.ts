import { execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
} from "node:fs";
import { get } from "node:http";
import { dirname } from "node:path";
import { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { gunzipSync, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { fileSignature } from "../src/auth.js";
import { scratchName, startTestEnvd, type TestEnvd } from "./harness.js";

const HOME = "/home/user";

function filesUrl(envd: TestEnvd, query: Record<string, string>): string {
  return `${envd.url}/files?${new URLSearchParams(query)}`;
}

async function errorOf(res: Response): Promise<{ status: number; code: unknown; message: string }> {
  const body = (await res.json()) as { code: unknown; message: string };
  return { status: res.status, code: body.code, message: body.message };
}

function multipart(boundary: string, parts: Array<{ name: string; filename?: string; data: string }>): Buffer {
  const chunks = parts.map((part) => {
    const filename = part.filename === undefined ? "" : `; filename="${part.filename}"`;
    return `--${boundary}\r\nContent-Disposition: form-data; name="${part.name}"${filename}\r\n\r\n${part.data}\r\n`;
  });
  return Buffer.from(`${chunks.join("")}--${boundary}--\r\n`);
}

/** Files under `prefix` that process `pid` holds open. */
function openFilesUnder(pid: number, prefix: string): string[] {
  const open: string[] = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      if (target.startsWith(prefix)) open.push(target);
    } catch {
      // Closed while we looked.
    }
  }
  return open;
}

/** Polls `condition` until it holds; the test's own timeout bounds the wait. */
async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await sleep(25);
}

/** Peak and current resident memory of a process, in bytes. */
function memoryOf(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1]) * 1024;
  return { rss: kb("VmRSS"), peak: kb("VmHWM") };
}

describe("GET and POST /files over plain HTTP", () => {
  let envd: TestEnvd;
  let dir: string;
  let abs: string;
  const rootFile = `/root/${scratchName("secret")}.txt`;

  beforeAll(async () => {
    envd = await startTestEnvd();
    dir = scratchName("http");
    abs = `${HOME}/${dir}`;
    mkdirSync(abs);
    execFileSync("chown", ["user:user", abs]);
    writeFileSync(rootFile, "root only", { mode: 0o600 });
  });

  afterAll(async () => {
    rmSync(abs, { recursive: true, force: true });
    rmSync(rootFile, { force: true });
    await envd?.stop();
  });

  const upload = (query: Record<string, string>, body: BodyInit, headers: Record<string, string> = {}) =>
    fetch(filesUrl(envd, query), {
      method: "POST",
      body,
      headers: { "Content-Type": "application/octet-stream", ...headers },
    });

  test("a missing file is 404 naming the resolved path", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/missing.txt` }));
    expect(await errorOf(res)).toEqual({ status: 404, code: 404, message: `path '${abs}/missing.txt' does not exist` });
  });

  test("downloading a directory is 400", async () => {
    const res = await fetch(filesUrl(envd, { path: dir }));
    expect(await errorOf(res)).toEqual({ status: 400, code: 400, message: `path '${abs}' is a directory` });
  });

  test("an unknown username is 401 'error looking up user'", async () => {
    const res = await fetch(filesUrl(envd, { path: "x", username: "no-such-user" }));
    const error = await errorOf(res);
    expect(error.status).toBe(401);
    expect(error.message).toMatch(/^error looking up user 'no-such-user': /);
  });

  test("a download carries Content-Disposition, Content-Type by extension, Content-Length and Vary", async () => {
    writeFileSync(`${abs}/data.json`, '{"a":1}');
    const res = await fetch(filesUrl(envd, { path: `${dir}/data.json` }), {
      headers: { "Accept-Encoding": "identity" },
    });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-disposition")).toBe('inline; filename="data.json"');
    expect(res.headers.get("content-type")).toBe("application/json");
    expect(res.headers.get("content-length")).toBe("7");
    expect(res.headers.get("vary")).toBe("Accept-Encoding");
    expect(await res.text()).toBe('{"a":1}');
  });

  test("a file without extension is sniffed as text or binary", async () => {
    writeFileSync(`${abs}/plain`, "just text\n");
    writeFileSync(`${abs}/binary`, Buffer.from([0, 1, 2, 3]));
    const text = await fetch(filesUrl(envd, { path: `${dir}/plain` }));
    expect(text.headers.get("content-type")).toBe("text/plain; charset=utf-8");
    const binary = await fetch(filesUrl(envd, { path: `${dir}/binary` }));
    expect(binary.headers.get("content-type")).toBe("application/octet-stream");
  });

  test("a file a process keeps truncating and rewriting downloads whole every time: Content-Length is what was read", async () => {
    // `echo $i > n` in a loop (a counter, a log rotated in place): between envd taking the size and reading, the file
    // may be empty. A Content-Length taken from the size then promised bytes that never came, and the client hung.
    const file = `${abs}/counter`;
    writeFileSync(file, "0\n");
    const writer = spawn("sh", ["-c", `i=0; while :; do i=$((i+1)); echo $i > ${file}; done`], { stdio: "ignore" });
    try {
      for (let i = 0; i < 300; i++) {
        const res = await fetch(filesUrl(envd, { path: `${dir}/counter` }), {
          headers: { "Accept-Encoding": "identity" },
          signal: AbortSignal.timeout(5000),
        });
        expect(res.status).toBe(200);
        const body = await res.text();
        expect(body).toMatch(/^(\d*\n?)$/);
        expect(Number(res.headers.get("content-length"))).toBe(Buffer.byteLength(body));
      }
    } finally {
      writer.kill("SIGKILL");
    }
  }, 60_000);

  test("a large file that shrinks while it streams ends the connection instead of leaving the client waiting", async () => {
    const file = `${abs}/big.bin`;
    writeFileSync(file, randomBytes(8 << 20));
    const outcome = await new Promise<{ promised: number; received: number; how: string }>((resolve) => {
      const req = get(
        filesUrl(envd, { path: `${dir}/big.bin` }),
        { headers: { "Accept-Encoding": "identity" } },
        (res) => {
          const promised = Number(res.headers["content-length"]);
          let received = 0;
          res.once("data", () => truncateSync(file, 0));
          res.on("data", (chunk: Buffer) => {
            received += chunk.length;
          });
          res.on("aborted", () => resolve({ promised, received, how: "aborted" }));
          res.on("error", () => resolve({ promised, received, how: "error" }));
          res.on("end", () => resolve({ promised, received, how: "end" }));
        },
      );
      req.on("error", () => resolve({ promised: -1, received: -1, how: "request error" }));
    });
    expect(outcome.promised).toBe(8 << 20);
    expect(outcome.received).toBeLessThan(outcome.promised);
    expect(outcome.how).not.toBe("end");
  }, 30_000);

  test("an empty file is 200 with Content-Length: 0", async () => {
    writeFileSync(`${abs}/empty.txt`, "");
    const res = await fetch(filesUrl(envd, { path: `${dir}/empty.txt` }), { headers: { "Accept-Encoding": "gzip" } });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-length")).toBe("0");
    expect(res.headers.get("content-encoding")).toBeNull();
  });

  test("Accept-Encoding: gzip gets a gzip body for compressible content", async () => {
    const text = "line of text\n".repeat(5000);
    writeFileSync(`${abs}/gz.txt`, text);
    const raw = await fetch(filesUrl(envd, { path: `${dir}/gz.txt` }), { headers: { "Accept-Encoding": "gzip" } });
    expect(raw.headers.get("content-encoding")).toBe("gzip");
    expect(raw.headers.get("vary")).toBe("Accept-Encoding");
    // fetch decodes transparently; check the bytes really were gzip by decoding them ourselves.
    const decoded = await raw.text();
    expect(decoded).toBe(text);
    const res = await new Promise<Buffer>((resolve, reject) => {
      import("node:http").then(({ get }) =>
        get(filesUrl(envd, { path: `${dir}/gz.txt` }), { headers: { "Accept-Encoding": "gzip" } }, (r) => {
          const chunks: Buffer[] = [];
          r.on("data", (c: Buffer) => chunks.push(c)).on("end", () => resolve(Buffer.concat(chunks)));
        }).on("error", reject),
      );
    });
    expect(gunzipSync(res).toString()).toBe(text);
  });

  test("Accept-Encoding that refuses identity and gzip is 406", async () => {
    writeFileSync(`${abs}/refuse.txt`, "x");
    const res = await fetch(filesUrl(envd, { path: `${dir}/refuse.txt` }), {
      headers: { "Accept-Encoding": "br, identity;q=0" },
    });
    expect(res.status).toBe(406);
  });

  test("a Range request answers 206 with the slice and Content-Range", async () => {
    writeFileSync(`${abs}/range.txt`, "0123456789");
    const res = await fetch(filesUrl(envd, { path: `${dir}/range.txt` }), { headers: { Range: "bytes=2-5" } });
    expect(res.status).toBe(206);
    expect(res.headers.get("content-range")).toBe("bytes 2-5/10");
    expect(res.headers.get("content-length")).toBe("4");
    expect(await res.text()).toBe("2345");
    const suffix = await fetch(filesUrl(envd, { path: `${dir}/range.txt` }), { headers: { Range: "bytes=-3" } });
    expect(await suffix.text()).toBe("789");
  });

  test("an unsatisfiable Range is 416 with Content-Range: bytes */size", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/range.txt` }), { headers: { Range: "bytes=50-60" } });
    expect(res.status).toBe(416);
    expect(res.headers.get("content-range")).toBe("bytes */10");
  });

  test("several ranges are answered with the whole file", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/range.txt` }), { headers: { Range: "bytes=0-1,4-5" } });
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("0123456789");
  });

  test("a user may not read root's private file: 403 naming the path", async () => {
    const res = await fetch(filesUrl(envd, { path: rootFile, username: "user" }));
    const error = await errorOf(res);
    expect(error.status).toBe(403);
    expect(error.message).toContain("/root");
    const asRoot = await fetch(filesUrl(envd, { path: rootFile, username: "root" }));
    expect(await asRoot.text()).toBe("root only");
  });

  test("an upload needs no permission of the user: envd writes into /root and hands the file over (E2B)", async () => {
    const target = `/root/${scratchName("handed")}/nested/file.txt`;
    const res = await upload({ path: target, username: "user" }, "theirs");
    try {
      expect(res.status).toBe(200);
      expect(readFileSync(target, "utf8")).toBe("theirs");
      const uid = statSync(HOME).uid;
      expect(statSync(target)).toMatchObject({ uid, mode: 0o100644 });
      // Only the folders envd created are handed over; /root stays root's.
      expect(statSync(dirname(target))).toMatchObject({ uid, mode: 0o40755 });
      expect(statSync(dirname(dirname(target))).uid).toBe(uid);
      expect(statSync("/root").uid).toBe(0);
    } finally {
      rmSync(dirname(dirname(target)), { recursive: true, force: true });
    }
  });

  test("an octet-stream upload without a path query is 400", async () => {
    const res = await upload({}, "data");
    expect(await errorOf(res)).toEqual({
      status: 400,
      code: 400,
      message: "path query parameter is required for raw body upload",
    });
  });

  test("an unsupported content type is 400 'unsupported content type'", async () => {
    const res = await upload({ path: `${dir}/x.txt` }, "data", { "Content-Type": "text/plain" });
    const error = await errorOf(res);
    expect(error.status).toBe(400);
    expect(error.message).toMatch(/^unsupported content type/);
  });

  test("an unsupported Content-Encoding is 400", async () => {
    const res = await upload({ path: `${dir}/x.txt` }, "data", { "Content-Encoding": "br" });
    expect((await errorOf(res)).status).toBe(400);
  });

  test("a gzip octet-stream body is decompressed", async () => {
    const res = await upload({ path: `${dir}/unzipped.txt` }, gzipSync("zipped content"), {
      "Content-Encoding": "gzip",
    });
    expect(res.status).toBe(200);
    expect(readFileSync(`${abs}/unzipped.txt`, "utf8")).toBe("zipped content");
  });

  test("a corrupt gzip body is 400 and leaves no file behind", async () => {
    const res = await upload({ path: `${dir}/corrupt.txt` }, "definitely not gzip", { "Content-Encoding": "gzip" });
    expect((await errorOf(res)).status).toBe(400);
    expect(existsSync(`${abs}/corrupt.txt`)).toBe(false);
  });

  test("uploading onto a directory is 400", async () => {
    mkdirSync(`${abs}/a-dir`, { recursive: true });
    const res = await upload({ path: `${dir}/a-dir` }, "data");
    expect((await errorOf(res)).status).toBe(400);
  });

  test("a new upload is 0644 and owned by the user, its parents 0755", async () => {
    const res = await upload({ path: `${dir}/p/q/new.txt` }, "new");
    expect(await res.json()).toEqual([{ path: `${abs}/p/q/new.txt`, name: "new.txt", type: "file" }]);
    const file = statSync(`${abs}/p/q/new.txt`);
    const parent = statSync(`${abs}/p/q`);
    expect(file.mode & 0o777).toBe(0o644);
    expect(parent.mode & 0o777).toBe(0o755);
    expect(file.uid).toBe(statSync(HOME).uid);
    expect(parent.uid).toBe(statSync(HOME).uid);
  });

  test("multipart parts are written in order, targets from filenames verbatim", async () => {
    const boundary = "b0undary";
    const res = await fetch(filesUrl(envd, {}), {
      method: "POST",
      headers: { "Content-Type": `multipart/form-data; boundary=${boundary}` },
      body: multipart(boundary, [
        { name: "file", filename: `${dir}/m/first.txt`, data: "1" },
        { name: "other", data: "ignored field" },
        { name: "file", filename: `${abs}/m/second.txt`, data: "2" },
      ]),
    });
    expect(await res.json()).toEqual([
      { path: `${abs}/m/first.txt`, name: "first.txt", type: "file" },
      { path: `${abs}/m/second.txt`, name: "second.txt", type: "file" },
    ]);
  });

  test("two multipart parts to the same path are 400", async () => {
    const boundary = "dup";
    const res = await fetch(filesUrl(envd, {}), {
      method: "POST",
      headers: { "Content-Type": `multipart/form-data; boundary=${boundary}` },
      body: multipart(boundary, [
        { name: "file", filename: `${dir}/dup.txt`, data: "1" },
        { name: "file", filename: `${abs}/dup.txt`, data: "2" },
      ]),
    });
    const error = await errorOf(res);
    expect(error.status).toBe(400);
    expect(error.message).toContain(`'${abs}/dup.txt'`);
  });

  test("a file part without filename and without path query is 400", async () => {
    const boundary = "nofn";
    const res = await fetch(filesUrl(envd, {}), {
      method: "POST",
      headers: { "Content-Type": `multipart/form-data; boundary=${boundary}` },
      body: multipart(boundary, [{ name: "file", data: "orphan" }]),
    });
    expect((await errorOf(res)).status).toBe(400);
  });

  test("a malformed multipart body (no closing boundary) is 400 and leaves no partial file", async () => {
    const boundary = "broken";
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${dir}/partial.txt"\r\n\r\nhalf of it`;
    const res = await fetch(filesUrl(envd, {}), {
      method: "POST",
      headers: { "Content-Type": `multipart/form-data; boundary=${boundary}` },
      body,
    });
    const error = await errorOf(res);
    expect(error.status).toBe(400);
    expect(existsSync(`${abs}/partial.txt`)).toBe(false);
  });

  test("a multipart content type without boundary is 400", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/x.txt` }), {
      method: "POST",
      headers: { "Content-Type": "multipart/form-data" },
      body: "whatever",
    });
    expect((await errorOf(res)).status).toBe(400);
  });

  test("metadata headers are stored, lower-cased, and returned", async () => {
    const res = await upload({ path: `${dir}/meta.txt` }, "m", {
      "X-Metadata-Author": "Mish",
      "X-Metadata-Tag": "a b",
    });
    expect(await res.json()).toEqual([
      { path: `${abs}/meta.txt`, name: "meta.txt", type: "file", metadata: { author: "Mish", tag: "a b" } },
    ]);
    const xattr = execFileSync("getfattr", ["-n", "user.e2b.author", "--only-values", `${abs}/meta.txt`]);
    expect(xattr.toString()).toBe("Mish");
  });

  test("invalid metadata (non-ASCII value, long key, too much) is 400 and writes nothing", async () => {
    const cases: Array<Record<string, string>> = [
      { "X-Metadata-k": "caf\u00e9" },
      { [`X-Metadata-${"k".repeat(247)}`]: "v" },
      Object.fromEntries(Array.from({ length: 5 }, (_, i) => [`X-Metadata-k${i}`, "v".repeat(1000)])),
    ];
    for (const headers of cases) {
      const res = await upload({ path: `${dir}/bad-meta.txt` }, "x", headers);
      expect((await errorOf(res)).status).toBe(400);
    }
    expect(existsSync(`${abs}/bad-meta.txt`)).toBe(false);
  });

  test("a NUL byte in the path is 400, never a crash", async () => {
    const res = await fetch(`${envd.url}/files?path=a%00b`);
    expect((await errorOf(res)).status).toBe(400);
    expect((await fetch(`${envd.url}/health`)).status).toBe(204);
  });

  test("other methods on /files are 405", async () => {
    const res = await fetch(filesUrl(envd, { path: "x" }), { method: "DELETE" });
    expect(res.status).toBe(405);
  });

  test("aborted downloads and uploads close their files and remove a half-written new file", async () => {
    const pid = envd.child.pid as number;
    writeFileSync(`${abs}/abort-me.bin`, Buffer.alloc(64 * 1024 * 1024, 1));
    const download = new AbortController();
    const res = await fetch(filesUrl(envd, { path: `${dir}/abort-me.bin` }), {
      headers: { "Accept-Encoding": "identity" },
      signal: download.signal,
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    download.abort();
    await until(() => openFilesUnder(pid, abs).length === 0);

    const target = `${abs}/half-written.bin`;
    const upload = new AbortController();
    const stalled = Readable.from(
      (async function* () {
        yield Buffer.alloc(1024 * 1024, 2);
        await new Promise(() => {});
      })(),
    );
    const pending = fetch(filesUrl(envd, { path: `${dir}/half-written.bin` }), {
      method: "POST",
      headers: { "Content-Type": "application/octet-stream" },
      body: stalled as unknown as BodyInit,
      duplex: "half",
      signal: upload.signal,
    } as RequestInit).catch(() => undefined);
    await until(() => openFilesUnder(pid, abs).includes(target));
    upload.abort();
    await pending;
    await until(() => openFilesUnder(pid, abs).length === 0 && !existsSync(target));
    expect((await fetch(`${envd.url}/health`)).status).toBe(204);
  });

  test("overwriting root's read-only file hands it to the user with its mode kept, as E2B's envd does", async () => {
    writeFileSync(`${abs}/roots.txt`, "root's longer content");
    chmodSync(`${abs}/roots.txt`, 0o444);
    const res = await upload({ path: `${dir}/roots.txt`, username: "user" }, "user's");
    expect(res.status).toBe(200);
    expect(readFileSync(`${abs}/roots.txt`, "utf8")).toBe("user's");
    expect(statSync(`${abs}/roots.txt`)).toMatchObject({ uid: statSync(HOME).uid, mode: 0o100444 });
  });

  test("root overwriting the user's file takes it over", async () => {
    writeFileSync(`${abs}/users.txt`, "user's");
    execFileSync("chown", ["user:user", `${abs}/users.txt`]);
    expect((await upload({ path: `${abs}/users.txt`, username: "root" }, "root's")).status).toBe(200);
    expect(statSync(`${abs}/users.txt`)).toMatchObject({ uid: 0, gid: 0 });
  });

  test("a device or FIFO is not an upload target: 400 and it stays as it was", async () => {
    execFileSync("mkfifo", [`${abs}/fifo`]);
    const fifo = await errorOf(await upload({ path: `${dir}/fifo`, username: "user" }, "x"));
    expect(fifo).toMatchObject({ status: 400, message: `path '${abs}/fifo' is not a regular file` });
    const owner = statSync("/dev/null").uid;
    const device = await errorOf(await upload({ path: "/dev/null", username: "user" }, "x"));
    expect(device.status).toBe(400);
    expect(statSync("/dev/null").uid).toBe(owner);
  });

  test("a file on the way to the target is 400, not 500", async () => {
    writeFileSync(`${abs}/plain.txt`, "p");
    const res = await upload({ path: `${dir}/plain.txt/below.txt` }, "x");
    expect(await errorOf(res)).toMatchObject({ status: 400, code: 400 });
  });

  test("a full disk is 507 'not enough disk space available' and leaves no partial file", async () => {
    const mount = `/tmp/${scratchName("full")}`;
    mkdirSync(mount);
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", mount]);
    try {
      const res = await upload({ path: `${mount}/big.bin`, username: "root" }, new Uint8Array(2 * 1024 * 1024));
      expect(await errorOf(res)).toEqual({ status: 507, code: 507, message: "not enough disk space available" });
      expect(existsSync(`${mount}/big.bin`)).toBe(false);
    } finally {
      execFileSync("umount", [mount]);
      rmSync(mount, { recursive: true, force: true });
    }
  });

  test("a 1 GiB upload and download stream through envd without growing its memory", async () => {
    const pid = envd.child.pid as number;
    const before = memoryOf(pid);
    const chunk = Buffer.alloc(1 << 20, 7);
    const total = 1024;
    const body = Readable.from(
      (function* () {
        for (let i = 0; i < total; i++) yield chunk;
      })(),
    );
    const res = await fetch(filesUrl(envd, { path: `${dir}/huge.bin` }), {
      method: "POST",
      headers: { "Content-Type": "application/octet-stream" },
      body: body as unknown as BodyInit,
      duplex: "half",
    } as RequestInit);
    expect(res.status).toBe(200);
    expect(statSync(`${abs}/huge.bin`).size).toBe(total << 20);

    const download = await fetch(filesUrl(envd, { path: `${dir}/huge.bin` }), {
      headers: { "Accept-Encoding": "identity" },
    });
    let received = 0;
    for await (const part of download.body as unknown as AsyncIterable<Uint8Array>) received += part.length;
    expect(received).toBe(total << 20);
    rmSync(`${abs}/huge.bin`);

    const after = memoryOf(pid);
    expect(after.peak - before.rss).toBeLessThan(200 * 1024 * 1024);
  }, 120_000);
});

describe("/files auth on a secured envd", () => {
  const token = randomBytes(16).toString("hex");
  let envd: TestEnvd;
  let dir: string;

  beforeAll(async () => {
    envd = await startTestEnvd({ accessToken: token });
    dir = scratchName("auth");
    mkdirSync(`${HOME}/${dir}`);
    execFileSync("chown", ["user:user", `${HOME}/${dir}`]);
    writeFileSync(`${HOME}/${dir}/a.txt`, "authorized");
  });

  afterAll(async () => {
    rmSync(`${HOME}/${dir}`, { recursive: true, force: true });
    await envd?.stop();
  });

  test("without token or signature the answer is 401 'missing signature query parameter'", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/a.txt` }));
    expect(await errorOf(res)).toEqual({ status: 401, code: 401, message: "missing signature query parameter" });
  });

  test("a wrong X-Access-Token is 401 even with a valid signature", async () => {
    const path = `${dir}/a.txt`;
    const signature = fileSignature(path, "read", "", token);
    const res = await fetch(filesUrl(envd, { path, signature }), { headers: { "X-Access-Token": "wrong" } });
    expect(await errorOf(res)).toEqual({
      status: 401,
      code: 401,
      message: "access token present in header but does not match",
    });
  });

  test("the right X-Access-Token is enough", async () => {
    const res = await fetch(filesUrl(envd, { path: `${dir}/a.txt` }), { headers: { "X-Access-Token": token } });
    expect(await res.text()).toBe("authorized");
  });

  test("a signature for another path, user or operation is 401 'invalid signature'", async () => {
    const path = `${dir}/a.txt`;
    const wrong = [
      fileSignature(`${dir}/b.txt`, "read", "", token),
      fileSignature(path, "read", "root", token),
      fileSignature(path, "write", "", token),
      fileSignature(path, "read", "", "other-token"),
    ];
    for (const signature of wrong) {
      const res = await fetch(filesUrl(envd, { path, signature }));
      expect(await errorOf(res)).toEqual({ status: 401, code: 401, message: "invalid signature" });
    }
  });

  test("a valid unexpired signature with username reads as that user", async () => {
    const path = `${dir}/a.txt`;
    const expiration = Math.floor(Date.now() / 1000) + 60;
    const signature = fileSignature(path, "read", "user", token, expiration);
    const query = { username: "user", path, signature, signature_expiration: String(expiration) };
    const res = await fetch(filesUrl(envd, query));
    expect(await res.text()).toBe("authorized");
  });

  test("a signature whose expiration was tampered with is 401 'invalid signature'", async () => {
    const path = `${dir}/a.txt`;
    const expiration = Math.floor(Date.now() / 1000) - 10;
    const signature = fileSignature(path, "read", "", token, expiration);
    const query = { path, signature, signature_expiration: String(expiration + 3600) };
    const res = await fetch(filesUrl(envd, query));
    expect((await errorOf(res)).message).toBe("invalid signature");
  });

  test("a write signature allows an upload; a rejected upload body does not hang the client", async () => {
    const path = `${dir}/signed-up.txt`;
    const signature = fileSignature(path, "write", "", token);
    const ok = await fetch(filesUrl(envd, { path, signature }), {
      method: "POST",
      headers: { "Content-Type": "application/octet-stream" },
      body: "signed",
    });
    expect(ok.status).toBe(200);
    const denied = await fetch(filesUrl(envd, { path }), {
      method: "POST",
      headers: { "Content-Type": "application/octet-stream" },
      body: new Uint8Array(4 * 1024 * 1024),
    });
    expect(denied.status).toBe(401);
  });
});
