import { afterAll, beforeAll, describe, expect, test } from "vitest";
import {
  FileNotFoundError,
  type FilesystemEvent,
  FilesystemEventType,
  FileType,
  getSignature,
  InvalidArgumentError,
  type Sandbox,
} from "../src/index.js";
import { scratch, startEnvd, type TestEnvd, until, warrenSandbox } from "./harness.js";

const TOKEN = "files-token";
let envd: TestEnvd;
let sandbox: Sandbox;

beforeAll(async () => {
  envd = await startEnvd({ accessToken: TOKEN });
  sandbox = warrenSandbox(envd.url, { accessToken: TOKEN });
});
afterAll(async () => {
  await envd?.stop();
});

describe("files", () => {
  test("write then read text, bytes, blob and stream round-trip the content", async () => {
    const path = `${scratch("rw")}/hello.txt`;
    const info = await sandbox.files.write(path, "héllo");
    expect(info).toEqual({ name: "hello.txt", type: FileType.FILE, path: `/home/user/${path}` });
    expect(await sandbox.files.read(path)).toBe("héllo");
    expect(await sandbox.files.read(path, { format: "bytes" })).toEqual(new TextEncoder().encode("héllo"));
    expect(await (await sandbox.files.read(path, { format: "blob" })).text()).toBe("héllo");
    const stream = await sandbox.files.read(path, { format: "stream" });
    expect(await new Response(stream).text()).toBe("héllo");
  });

  test("a ReadableStream is uploaded as a stream (octet-stream) and gzip uploads round-trip", async () => {
    const dir = scratch("stream");
    const big = "x".repeat(300_000);
    const stream = new Response(big).body as ReadableStream<Uint8Array>;
    await sandbox.files.write(`${dir}/big.txt`, stream);
    expect((await sandbox.files.read(`${dir}/big.txt`)).length).toBe(300_000);
    await sandbox.files.write(`${dir}/gz.txt`, "zipped", { gzip: true });
    expect(await sandbox.files.read(`${dir}/gz.txt`, { gzip: true })).toBe("zipped");
  });

  test("write of several files returns one entry per file in order; metadata is kept", async () => {
    const dir = scratch("multi");
    const written = await sandbox.files.write(
      [
        { path: `${dir}/a.txt`, data: "A" },
        { path: `${dir}/b.bin`, data: new Uint8Array([1, 2, 3]).buffer },
      ],
      { metadata: { owner: "tests" } },
    );
    expect(written.map((w) => w.name)).toEqual(["a.txt", "b.bin"]);
    const info = await sandbox.files.getInfo(`${dir}/a.txt`);
    expect(info.metadata).toEqual({ owner: "tests" });
  });

  test("invalid metadata is rejected before anything is sent", async () => {
    await expect(sandbox.files.write("x.txt", "x", { metadata: { "bad key": "v" } })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
  });

  test("list, getInfo, exists, makeDir, rename and remove behave like E2B's", async () => {
    const dir = scratch("ops");
    expect(await sandbox.files.makeDir(`${dir}/sub`)).toBe(true);
    expect(await sandbox.files.makeDir(`${dir}/sub`)).toBe(false);
    await sandbox.files.write(`${dir}/file.txt`, "data");
    const entries = await sandbox.files.list(dir);
    expect(entries.map((e) => [e.name, e.type])).toEqual([
      ["file.txt", FileType.FILE],
      ["sub", FileType.DIR],
    ]);
    const info = await sandbox.files.getInfo(`${dir}/file.txt`);
    expect(info).toMatchObject({ name: "file.txt", size: 4, mode: 0o644, permissions: "-rw-r--r--", owner: "user" });
    expect(info.modifiedTime).toBeInstanceOf(Date);
    const moved = await sandbox.files.rename(`${dir}/file.txt`, `${dir}/sub/moved.txt`);
    expect(moved.path).toBe(`/home/user/${dir}/sub/moved.txt`);
    expect(await sandbox.files.exists(`${dir}/file.txt`)).toBe(false);
    expect((await sandbox.files.list(dir, { depth: 2 })).map((e) => e.path)).toEqual([
      `/home/user/${dir}/sub`,
      `/home/user/${dir}/sub/moved.txt`,
    ]);
    await sandbox.files.remove(dir);
    expect(await sandbox.files.exists(dir)).toBe(false);
    await expect(sandbox.files.list(dir, { depth: 0 })).rejects.toBeInstanceOf(InvalidArgumentError);
  });

  test("missing files raise FileNotFoundError from read, getInfo and rename", async () => {
    const missing = scratch("missing");
    await expect(sandbox.files.read(missing)).rejects.toBeInstanceOf(FileNotFoundError);
    await expect(sandbox.files.getInfo(missing)).rejects.toBeInstanceOf(FileNotFoundError);
    await expect(sandbox.files.rename(missing, `${missing}-2`)).rejects.toBeInstanceOf(FileNotFoundError);
  });

  test("the user option changes path resolution and ownership", async () => {
    const name = scratch("root");
    const info = await sandbox.files.write(name, "r", { user: "root" });
    expect(info.path).toBe(`/root/${name}`);
    expect((await sandbox.files.getInfo(name, { user: "root" })).owner).toBe("root");
    await sandbox.files.remove(name, { user: "root" });
  });

  test("watchDir reports create and write events (recursive, with entries) until stopped", async () => {
    const dir = scratch("watch");
    await sandbox.files.makeDir(`${dir}/nested`);
    const events: FilesystemEvent[] = [];
    let exited = false;
    const handle = await sandbox.files.watchDir(dir, (e) => void events.push(e), {
      recursive: true,
      includeEntry: true,
      onExit: () => {
        exited = true;
      },
    });
    await sandbox.files.write(`${dir}/nested/file.txt`, "w");
    await until(
      () => events.some((e) => e.name === "nested/file.txt" && e.type === FilesystemEventType.WRITE),
      "a write event",
    );
    const write = events.find((e) => e.type === FilesystemEventType.WRITE);
    expect(write?.entry?.name).toBe("file.txt");
    await handle.stop();
    expect(exited).toBe(true);
  });

  test("watchDir on a missing directory throws FileNotFoundError", async () => {
    await expect(sandbox.files.watchDir(scratch("nowatch"), () => undefined)).rejects.toBeInstanceOf(FileNotFoundError);
  });
});

describe("signed URLs", () => {
  test("getSignature matches E2B's published test vector", () => {
    const { signature } = getSignature({
      path: "hello.txt",
      operation: "read",
      user: "user",
      envdAccessToken: "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0",
    });
    expect(signature).toBe("v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E");
  });

  test("downloadUrl and uploadUrl work without any header; expired signatures are refused", async () => {
    const name = scratch("signed");
    const upload = await sandbox.uploadUrl(name, { useSignatureExpiration: 60 });
    const form = new FormData();
    form.append("file", new Blob(["via url"]), name);
    const up = await fetch(upload, { method: "POST", body: form });
    expect(up.status).toBe(200);
    expect(await up.json()).toEqual([{ name, path: `/home/user/${name}`, type: "file" }]);

    const download = await sandbox.downloadUrl(name);
    const down = await fetch(download);
    expect(await down.text()).toBe("via url");

    const expired = await sandbox.files.downloadUrl(name, { useSignatureExpiration: -10 });
    const refused = await fetch(expired);
    expect(refused.status).toBe(401);
    expect(await refused.json()).toEqual({ code: 401, message: "signature is already expired" });
  });

  test("signature expiration on a sandbox without an access token is an InvalidArgumentError", async () => {
    const open = warrenSandbox(envd.url);
    await expect(open.downloadUrl("x", { useSignatureExpiration: 10 })).rejects.toBeInstanceOf(InvalidArgumentError);
  });
});
