import { createHash, randomBytes } from "node:crypto";
import { rmSync, statSync, symlinkSync } from "node:fs";
import { basename } from "node:path";
import {
  FileNotFoundError,
  type FilesystemEvent,
  FilesystemEventType,
  getSignature,
  InvalidArgumentError,
  type Sandbox,
  SandboxError,
} from "e2b";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { fileSignature } from "../src/auth.js";
import { scratchName, sdkSandbox, startTestEnvd, type TestEnvd } from "./harness.js";

const HOME = "/home/user";
const USER_UID = statSync(HOME).uid;

/** Resolves with the first event `predicate` accepts; the test's own timeout bounds the wait. */
function eventWaiter(predicate: (event: FilesystemEvent) => boolean) {
  let resolve!: (event: FilesystemEvent) => void;
  const seen = new Promise<FilesystemEvent>((r) => {
    resolve = r;
  });
  return {
    seen,
    onEvent: (event: FilesystemEvent) => {
      if (predicate(event)) resolve(event);
    },
  };
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}

/** A web ReadableStream of `total` pseudo-random bytes, produced in 1 MiB chunks, and its sha256. */
function generatedStream(total: number): { stream: ReadableStream<Uint8Array>; sha256: string } {
  const block = randomBytes(1 << 20);
  const hash = createHash("sha256");
  for (let sent = 0; sent < total; sent += block.length)
    hash.update(block.subarray(0, Math.min(block.length, total - sent)));
  let sent = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (sent >= total) return controller.close();
      const chunk = block.subarray(0, Math.min(block.length, total - sent));
      sent += chunk.length;
      controller.enqueue(new Uint8Array(chunk));
    },
  });
  return { stream, sha256: hash.digest("hex") };
}

describe("files through the official e2b SDK", () => {
  let envd: TestEnvd;
  let sandbox: Sandbox;
  let dir: string;
  let abs: string;

  beforeAll(async () => {
    envd = await startTestEnvd();
    sandbox = sdkSandbox(envd);
    dir = scratchName("sdk");
    abs = `${HOME}/${dir}`;
    await sandbox.files.makeDir(dir);
  });

  afterAll(async () => {
    rmSync(abs, { recursive: true, force: true });
    await envd?.stop();
  });

  test("write returns {name,type,path} under the user's home and read gives the text back", async () => {
    const info = await sandbox.files.write(`${dir}/hello.txt`, "hello world");
    expect(info).toEqual({ name: "hello.txt", type: "file", path: `${abs}/hello.txt` });
    expect(await sandbox.files.read(`${dir}/hello.txt`)).toBe("hello world");
  });

  test("read returns bytes, blob and stream formats with the same content", async () => {
    await sandbox.files.write(`${dir}/formats.bin`, new Uint8Array([0, 1, 2, 255]));
    expect([...(await sandbox.files.read(`${dir}/formats.bin`, { format: "bytes" }))]).toEqual([0, 1, 2, 255]);
    const blob = await sandbox.files.read(`${dir}/formats.bin`, { format: "blob" });
    expect([...new Uint8Array(await blob.arrayBuffer())]).toEqual([0, 1, 2, 255]);
    const stream = await sandbox.files.read(`${dir}/formats.bin`, { format: "stream" });
    expect([...(await collect(stream))]).toEqual([0, 1, 2, 255]);
  });

  test("a 50 MB stream uploads and downloads intact", async () => {
    const { stream, sha256 } = generatedStream(50 * 1024 * 1024);
    await sandbox.files.write(`${dir}/big.bin`, stream);
    const back = await sandbox.files.read(`${dir}/big.bin`, { format: "stream" });
    const hash = createHash("sha256");
    let size = 0;
    for await (const chunk of back as unknown as AsyncIterable<Uint8Array>) {
      hash.update(chunk);
      size += chunk.length;
    }
    expect(size).toBe(50 * 1024 * 1024);
    expect(hash.digest("hex")).toBe(sha256);
  });

  test("an empty file reads back empty in every format", async () => {
    await sandbox.files.write(`${dir}/empty.txt`, "");
    expect(await sandbox.files.read(`${dir}/empty.txt`)).toBe("");
    expect((await sandbox.files.read(`${dir}/empty.txt`, { format: "bytes" })).length).toBe(0);
    expect((await sandbox.files.read(`${dir}/empty.txt`, { format: "blob" })).size).toBe(0);
    const stream = await sandbox.files.read(`${dir}/empty.txt`, { format: "stream" });
    expect((await collect(stream)).length).toBe(0);
    expect((await sandbox.files.getInfo(`${dir}/empty.txt`)).size).toBe(0);
  });

  test("gzip uploads are decompressed and gzip downloads decode to the original", async () => {
    const text = "compress me ".repeat(1000);
    await sandbox.files.write(`${dir}/gz.txt`, text, { gzip: true });
    expect(await sandbox.files.read(`${dir}/gz.txt`)).toBe(text);
    expect(await sandbox.files.read(`${dir}/gz.txt`, { gzip: true })).toBe(text);
    expect((await sandbox.files.getInfo(`${dir}/gz.txt`)).size).toBe(text.length);
  });

  test("useOctetStream uploads the raw body to the path", async () => {
    const info = await sandbox.files.write(`${dir}/octet.txt`, "raw body", { useOctetStream: true });
    expect(info).toEqual({ name: "octet.txt", type: "file", path: `${abs}/octet.txt` });
    expect(await sandbox.files.read(`${dir}/octet.txt`)).toBe("raw body");
  });

  test("writeFiles writes absolute and relative paths in one request and answers in order", async () => {
    const infos = await sandbox.files.writeFiles([
      { path: `${abs}/multi/one.txt`, data: "one" },
      { path: `${dir}/multi/two.txt`, data: new Blob(["two"]) },
      { path: `${dir}/multi/three.txt`, data: new TextEncoder().encode("three").buffer as ArrayBuffer },
    ]);
    expect(infos.map((info) => info.path)).toEqual([
      `${abs}/multi/one.txt`,
      `${abs}/multi/two.txt`,
      `${abs}/multi/three.txt`,
    ]);
    expect(await sandbox.files.read(`${dir}/multi/two.txt`)).toBe("two");
    expect(await sandbox.files.read(`${dir}/multi/three.txt`)).toBe("three");
  });

  // E2B's own `sandbox/files/write > write multiple files` writes /<i>/multi_test_file<i>.txt as the default user.
  test("write with an array creates folders under / for the user, as E2B's 'write multiple files' expects", async () => {
    const top = `/${scratchName("top")}`;
    const files = [0, 1, 2, 3].map((i) => ({
      path: i % 2 === 0 ? `${top}/${i}/multi_test_file${i}.txt` : `${abs}/multi_test_file${i}.txt`,
      data: `This is a test file ${i}.`,
    }));
    try {
      const infos = await sandbox.files.write(files);
      expect(infos).toEqual(files.map((file) => ({ name: basename(file.path), type: "file", path: file.path })));
      for (const file of files) {
        expect(await sandbox.files.exists(file.path)).toBe(true);
        expect(await sandbox.files.read(file.path)).toBe(file.data);
        expect(await sandbox.files.getInfo(file.path)).toMatchObject({ owner: "user", group: "user", mode: 0o644 });
      }
      for (const folder of [top, `${top}/0`, `${top}/2`]) {
        expect(await sandbox.files.getInfo(folder)).toMatchObject({ type: "dir", owner: "user", mode: 0o755 });
      }
      expect(statSync("/").uid).toBe(0);
    } finally {
      rmSync(top, { recursive: true, force: true });
    }
  });

  test("makeDir and rename make folders outside the user's home for them, as E2B's envd does", async () => {
    const top = `/${scratchName("top")}`;
    try {
      expect(await sandbox.files.makeDir(`${top}/made/deeper`)).toBe(true);
      expect(await sandbox.files.getInfo(`${top}/made`)).toMatchObject({ owner: "user", mode: 0o755 });
      await sandbox.files.write(`${dir}/to-move.txt`, "moved");
      const info = await sandbox.files.rename(`${dir}/to-move.txt`, `${top}/moved/here.txt`);
      expect(info).toMatchObject({ path: `${top}/moved/here.txt`, owner: "user" });
      expect(await sandbox.files.getInfo(`${top}/moved`)).toMatchObject({ owner: "user", mode: 0o755 });
    } finally {
      rmSync(top, { recursive: true, force: true });
    }
  });

  test("writing over a file replaces its content", async () => {
    await sandbox.files.write(`${dir}/over.txt`, "a much longer first version");
    await sandbox.files.write(`${dir}/over.txt`, "short");
    expect(await sandbox.files.read(`${dir}/over.txt`)).toBe("short");
  });

  test("writing into missing nested directories creates them 0755 and owned by the user", async () => {
    await sandbox.files.write(`${dir}/a/b/c/deep.txt`, "deep");
    const info = await sandbox.files.getInfo(`${dir}/a/b`);
    expect(info).toMatchObject({ type: "dir", mode: 0o755, permissions: "drwxr-xr-x", owner: "user", group: "user" });
    expect(statSync(`${abs}/a/b/c`).uid).toBe(USER_UID);
  });

  test("metadata written with multipart shows in the response, getInfo, list and after rename", async () => {
    const metadata = { author: "mish", purpose: "upload" };
    const info = await sandbox.files.write(`${dir}/meta/m.txt`, "content", { metadata });
    expect(info.metadata).toEqual(metadata);
    expect((await sandbox.files.getInfo(`${dir}/meta/m.txt`)).metadata).toEqual(metadata);
    const listed = await sandbox.files.list(`${dir}/meta`);
    expect(listed.find((entry) => entry.name === "m.txt")?.metadata).toEqual(metadata);
    const renamed = await sandbox.files.rename(`${dir}/meta/m.txt`, `${dir}/meta/renamed.txt`);
    expect(renamed.metadata).toEqual(metadata);
  });

  test("metadata written with an octet-stream upload is stored", async () => {
    const metadata = { stage: "octet" };
    const info = await sandbox.files.write(`${dir}/meta-octet.txt`, "x", { metadata, useOctetStream: true });
    expect(info.metadata).toEqual(metadata);
    expect((await sandbox.files.getInfo(`${dir}/meta-octet.txt`)).metadata).toEqual(metadata);
  });

  test("overwriting without metadata clears the earlier metadata", async () => {
    await sandbox.files.write(`${dir}/meta-clear.txt`, "first", { metadata: { author: "mish" } });
    const info = await sandbox.files.write(`${dir}/meta-clear.txt`, "second");
    expect(info.metadata).toBeUndefined();
    expect((await sandbox.files.getInfo(`${dir}/meta-clear.txt`)).metadata).toBeUndefined();
  });

  test("metadata the server cannot store (key over 246 bytes) is rejected with InvalidArgumentError", async () => {
    const write = sandbox.files.write(`${dir}/meta-bad.txt`, "x", { metadata: { ["k".repeat(247)]: "v" } });
    await expect(write).rejects.toThrow(InvalidArgumentError);
    expect(await sandbox.files.exists(`${dir}/meta-bad.txt`)).toBe(false);
  });

  test("getInfo describes a file exactly", async () => {
    await sandbox.files.write(`${dir}/info.txt`, "test");
    const info = await sandbox.files.getInfo(`${dir}/info.txt`);
    expect(info).toMatchObject({
      name: "info.txt",
      type: "file",
      path: `${abs}/info.txt`,
      size: 4,
      mode: 0o644,
      permissions: "-rw-r--r--",
      owner: "user",
      group: "user",
      symlinkTarget: undefined,
      metadata: undefined,
    });
    // Milliseconds on both sides, each rounded its own way from nanoseconds: at most 1 ms apart.
    expect(Math.abs(info.modifiedTime!.getTime() - statSync(`${abs}/info.txt`).mtimeMs)).toBeLessThanOrEqual(1);
  });

  test("getInfo describes a directory as dir 0755 drwxr-xr-x with a size", async () => {
    await sandbox.files.makeDir(`${dir}/info-dir`);
    const info = await sandbox.files.getInfo(`${dir}/info-dir`);
    expect(info).toMatchObject({
      name: "info-dir",
      type: "dir",
      mode: 0o755,
      permissions: "drwxr-xr-x",
      owner: "user",
    });
    expect(info.size).toBeGreaterThan(0);
  });

  test("getInfo of a symlink reports the target's type and its absolute target", async () => {
    await sandbox.files.write(`${dir}/target.txt`, "t");
    symlinkSync("target.txt", `${abs}/link.txt`);
    const info = await sandbox.files.getInfo(`${dir}/link.txt`);
    expect(info).toMatchObject({
      name: "link.txt",
      type: "file",
      path: `${abs}/link.txt`,
      permissions: "Lrwxrwxrwx",
      mode: 0o644,
      symlinkTarget: `${abs}/target.txt`,
    });
  });

  test("getInfo of a missing path throws FileNotFoundError", async () => {
    await expect(sandbox.files.getInfo(`${dir}/missing.txt`)).rejects.toThrow(FileNotFoundError);
  });

  test("list walks depth 1, 2 and 3 in lexical pre-order", async () => {
    const root = `${dir}/tree`;
    await sandbox.files.writeFiles([
      { path: `${root}/file1.txt`, data: "1" },
      { path: `${root}/subdir1/subdir1_1/deep.txt`, data: "d" },
      { path: `${root}/subdir1/subdir1_2/x.txt`, data: "x" },
      { path: `${root}/subdir2/file2.txt`, data: "2" },
    ]);
    const names = async (depth: number) =>
      (await sandbox.files.list(root, { depth })).map((e) => e.path.slice(`${abs}/tree/`.length));
    expect(await names(1)).toEqual(["file1.txt", "subdir1", "subdir2"]);
    expect(await names(2)).toEqual([
      "file1.txt",
      "subdir1",
      "subdir1/subdir1_1",
      "subdir1/subdir1_2",
      "subdir2",
      "subdir2/file2.txt",
    ]);
    expect(await names(3)).toEqual([
      "file1.txt",
      "subdir1",
      "subdir1/subdir1_1",
      "subdir1/subdir1_1/deep.txt",
      "subdir1/subdir1_2",
      "subdir1/subdir1_2/x.txt",
      "subdir2",
      "subdir2/file2.txt",
    ]);
    await expect(sandbox.files.list(root, { depth: 0 })).rejects.toThrow(InvalidArgumentError);
  });

  test("exists is true for files and directories and false for missing paths", async () => {
    await sandbox.files.write(`${dir}/exists.txt`, "e");
    expect(await sandbox.files.exists(`${dir}/exists.txt`)).toBe(true);
    expect(await sandbox.files.exists(dir)).toBe(true);
    expect(await sandbox.files.exists(`${dir}/nope`)).toBe(false);
  });

  test("makeDir answers true when it creates the directory and false the second time", async () => {
    expect(await sandbox.files.makeDir(`${dir}/made/twice`)).toBe(true);
    expect(await sandbox.files.makeDir(`${dir}/made/twice`)).toBe(false);
  });

  test("rename moves a file and a missing source throws FileNotFoundError", async () => {
    await sandbox.files.write(`${dir}/from.txt`, "moving");
    const info = await sandbox.files.rename(`${dir}/from.txt`, `${dir}/moved/to.txt`);
    expect(info).toMatchObject({ name: "to.txt", type: "file", path: `${abs}/moved/to.txt` });
    expect(await sandbox.files.read(`${dir}/moved/to.txt`)).toBe("moving");
    await expect(sandbox.files.rename(`${dir}/from.txt`, `${dir}/x.txt`)).rejects.toThrow(FileNotFoundError);
  });

  test("remove deletes directories recursively and ignores missing paths", async () => {
    await sandbox.files.write(`${dir}/gone/inner/file.txt`, "x");
    await sandbox.files.remove(`${dir}/gone`);
    expect(await sandbox.files.exists(`${dir}/gone`)).toBe(false);
    await sandbox.files.remove(`${dir}/gone`);
  });

  test("watchDir reports a WRITE when a file is written through the files API", async () => {
    await sandbox.files.write(`${dir}/watch1/file.txt`, "first");
    const waiter = eventWaiter((e) => e.type === FilesystemEventType.WRITE && e.name === "file.txt");
    const handle = await sandbox.files.watchDir(`${dir}/watch1`, waiter.onEvent);
    await sandbox.files.write(`${dir}/watch1/file.txt`, "second");
    await waiter.seen;
    await handle.stop();
  });

  test("a recursive watchDir names nested files relative to the watched directory", async () => {
    await sandbox.files.write(`${dir}/watch2/nested/file.txt`, "first");
    const waiter = eventWaiter((e) => e.type === FilesystemEventType.WRITE && e.name === "nested/file.txt");
    const handle = await sandbox.files.watchDir(`${dir}/watch2`, waiter.onEvent, { recursive: true });
    await sandbox.files.write(`${dir}/watch2/nested/file.txt`, "second");
    await waiter.seen;
    await handle.stop();
  });

  test("a recursive watchDir reports CREATE for a new subdirectory and then watches inside it", async () => {
    await sandbox.files.makeDir(`${dir}/watch3`);
    const folder = eventWaiter((e) => e.type === FilesystemEventType.CREATE && e.name === "added");
    const file = eventWaiter((e) => e.type === FilesystemEventType.WRITE && e.name === "added/file.txt");
    const handle = await sandbox.files.watchDir(
      `${dir}/watch3`,
      (e) => {
        folder.onEvent(e);
        file.onEvent(e);
      },
      { recursive: true },
    );
    await sandbox.files.makeDir(`${dir}/watch3/added`);
    await folder.seen;
    await sandbox.files.write(`${dir}/watch3/added/file.txt`, "content");
    await file.seen;
    await handle.stop();
  });

  test("watchDir with includeEntry attaches the entry to a WRITE event", async () => {
    await sandbox.files.makeDir(`${dir}/watch4`);
    const waiter = eventWaiter((e) => e.type === FilesystemEventType.WRITE && e.name === "entry.txt");
    const handle = await sandbox.files.watchDir(`${dir}/watch4`, waiter.onEvent, { includeEntry: true });
    await sandbox.files.write(`${dir}/watch4/entry.txt`, "12345");
    const event = await waiter.seen;
    expect(event.entry).toMatchObject({
      name: "entry.txt",
      type: "file",
      path: `${abs}/watch4/entry.txt`,
      owner: "user",
    });
    await handle.stop();
  });

  test("watchDir of a missing directory throws FileNotFoundError", async () => {
    await expect(sandbox.files.watchDir(`${dir}/no-such-dir`, () => {})).rejects.toThrow(FileNotFoundError);
  });

  test("watchDir of a file throws a SandboxError (invalid argument)", async () => {
    await sandbox.files.write(`${dir}/watch-file.txt`, "x");
    const watch = sandbox.files.watchDir(`${dir}/watch-file.txt`, () => {});
    await expect(watch).rejects.toThrow(SandboxError);
    await expect(sandbox.files.watchDir(`${dir}/watch-file.txt`, () => {})).rejects.toThrow(InvalidArgumentError);
  });
});

describe("signed file URLs on a secured envd", () => {
  const token = `tok-${randomBytes(12).toString("hex")}`;
  let envd: TestEnvd;
  let sandbox: Sandbox;
  let dir: string;
  const rootFile = `${scratchName("root")}.txt`;

  beforeAll(async () => {
    envd = await startTestEnvd({ accessToken: token });
    sandbox = sdkSandbox(envd, { accessToken: token });
    dir = scratchName("signed");
    await sandbox.files.makeDir(dir);
  });

  afterAll(async () => {
    rmSync(`${HOME}/${dir}`, { recursive: true, force: true });
    rmSync(`/root/${rootFile}`, { force: true });
    await envd?.stop();
  });

  test("the SDK signature and envd's agree with E2B's published test vector", async () => {
    const vector = "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E";
    const args = { path: "hello.txt", operation: "read" as const, user: "user" };
    const sdk = await getSignature({ ...args, envdAccessToken: "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0" });
    expect(sdk.signature).toBe(vector);
    expect(fileSignature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0")).toBe(vector);
  });

  test("a signed download URL works without any header", async () => {
    await sandbox.files.write(`${dir}/hello.txt`, "hello world");
    const url = await sandbox.downloadUrl(`${dir}/hello.txt`, { useSignatureExpiration: 10_000 });
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("hello world");
  });

  test("a signed download URL for root reads root's file", async () => {
    await sandbox.files.write(rootFile, "root secret", { user: "root" });
    const url = await sandbox.downloadUrl(rootFile, { user: "root", useSignatureExpiration: 10_000 });
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("root secret");
  });

  test("a signed upload URL accepts a form and answers exactly [{name,path,type}]", async () => {
    const url = await sandbox.uploadUrl(`${dir}/uploaded.txt`, { useSignatureExpiration: 10_000 });
    const form = new FormData();
    form.append("file", "file content");
    const res = await fetch(url, { method: "POST", body: form });
    expect(res.status).toBe(200);
    expect(JSON.parse(await res.text())).toStrictEqual([
      { name: "uploaded.txt", path: `${HOME}/${dir}/uploaded.txt`, type: "file" },
    ]);
    expect(await sandbox.files.read(`${dir}/uploaded.txt`)).toBe("file content");
  });

  test("a signed upload URL as root writes under /root", async () => {
    const name = `${scratchName("up")}.txt`;
    const url = await sandbox.uploadUrl(name, { user: "root", useSignatureExpiration: 10_000 });
    const form = new FormData();
    form.append("file", "file content");
    const res = await fetch(url, { method: "POST", body: form });
    expect(JSON.parse(await res.text())).toStrictEqual([{ name, path: `/root/${name}`, type: "file" }]);
    rmSync(`/root/${name}`, { force: true });
  });

  test("expired signed URLs answer 401 with E2B's exact JSON body", async () => {
    const download = await sandbox.downloadUrl(`${dir}/hello.txt`, { useSignatureExpiration: -10_000 });
    const res = await fetch(download);
    expect(res.status).toBe(401);
    expect(JSON.parse(await res.text())).toStrictEqual({ code: 401, message: "signature is already expired" });

    const upload = await sandbox.uploadUrl(`${dir}/late.txt`, { useSignatureExpiration: -100_000 });
    const form = new FormData();
    form.append("file", "file content");
    const up = await fetch(upload, { method: "POST", body: form });
    expect(up.status).toBe(401);
    expect(JSON.parse(await up.text())).toStrictEqual({ code: 401, message: "signature is already expired" });
  });

  test("the SDK's own reads and writes pass with the access token header", async () => {
    await sandbox.files.write(`${dir}/token.txt`, "via header");
    expect(await sandbox.files.read(`${dir}/token.txt`)).toBe("via header");
  });
});
