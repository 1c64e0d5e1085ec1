import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { type Sandbox, SandboxError } from "e2b";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { scratchName, sdkSandbox, startTestEnvd, type TestEnvd } from "./harness.js";

const AS_ROOT = { authorization: `Basic ${Buffer.from("root:").toString("base64")}` };

async function codeOf(call: Promise<unknown>): Promise<{ code: Code; message: string }> {
  try {
    await call;
  } catch (error) {
    const connect = ConnectError.from(error);
    return { code: connect.code, message: connect.rawMessage };
  }
  throw new Error("expected the call to fail");
}

async function rejectionOf(call: Promise<unknown>): Promise<Error> {
  try {
    await call;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected the call to fail");
}

// A read-only mount stands for /etc/resolv.conf, /proc/sys and the bind-mounted envd folder in a sandbox.
describe("writes on a read-only file system are the client's error, never 500", () => {
  let envd: TestEnvd;
  let fs: Client<typeof Filesystem>;
  let sandbox: Sandbox;
  const mount = `/tmp/${scratchName("read-only")}`;
  const existing = `${mount}/resolv.conf`;
  const readOnly = (path: string) => `path '${path}' is on a read-only file system`;

  beforeAll(async () => {
    mkdirSync(mount);
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", mount]);
    writeFileSync(existing, "nameserver 127.0.0.1\n");
    mkdirSync(`${mount}/dir`);
    execFileSync("mount", ["-o", "remount,ro", mount]);
    envd = await startTestEnvd();
    fs = createClient(Filesystem, createConnectTransport({ baseUrl: envd.url, httpVersion: "1.1" }));
    sandbox = sdkSandbox(envd);
  });

  afterAll(async () => {
    await envd?.stop();
    execFileSync("umount", [mount]);
    rmSync(mount, { recursive: true, force: true });
  });

  const upload = (path: string, username = "user") =>
    fetch(`${envd.url}/files?${new URLSearchParams({ path, username })}`, {
      method: "POST",
      body: "changed",
      headers: { "Content-Type": "application/octet-stream" },
    });

  test("overwriting a file there is 403 naming it, and the file is unchanged", async () => {
    for (const username of ["user", "root"]) {
      const res = await upload(existing, username);
      expect({ status: res.status, body: await res.json() }).toEqual({
        status: 403,
        body: { code: 403, message: readOnly(existing) },
      });
    }
    expect(readFileSync(existing, "utf8")).toBe("nameserver 127.0.0.1\n");
  });

  test("a new file or new folders there are 403 naming the first path that could not be made", async () => {
    const res = await upload(`${mount}/new.txt`);
    expect(await res.json()).toEqual({ code: 403, message: readOnly(`${mount}/new.txt`) });
    const nested = await upload(`${mount}/a/b/new.txt`);
    expect(await nested.json()).toEqual({ code: 403, message: readOnly(`${mount}/a`) });
  });

  test("MakeDir, Move and Remove there are permission_denied saying it is read-only", async () => {
    expect(await codeOf(fs.makeDir({ path: `${mount}/made` }))).toEqual({
      code: Code.PermissionDenied,
      message: readOnly(`${mount}/made`),
    });
    expect(await codeOf(fs.move({ source: existing, destination: `${mount}/moved` }, { headers: AS_ROOT }))).toEqual({
      code: Code.PermissionDenied,
      message: readOnly(`${mount}/moved`),
    });
    expect(await codeOf(fs.remove({ path: `${mount}/dir` }, { headers: AS_ROOT }))).toEqual({
      code: Code.PermissionDenied,
      message: readOnly(`${mount}/dir`),
    });
    expect(existsSync(`${mount}/dir`)).toBe(true);
  });

  test("the official SDK gets a SandboxError that says so, for write, writeFiles and makeDir", async () => {
    const write = await rejectionOf(sandbox.files.write(existing, "x"));
    expect(write).toBeInstanceOf(SandboxError);
    expect(write.message).toBe(`403: ${readOnly(existing)}`);
    const fine = `/tmp/${scratchName("fine")}.txt`;
    try {
      const many = await rejectionOf(
        sandbox.files.write([
          { path: fine, data: "ok" },
          { path: `${mount}/many.txt`, data: "x" },
        ]),
      );
      expect(many.message).toBe(`403: ${readOnly(`${mount}/many.txt`)}`);
    } finally {
      rmSync(fine, { force: true });
    }
    const makeDir = await rejectionOf(sandbox.files.makeDir(`${mount}/sdk-dir`));
    expect(makeDir).toBeInstanceOf(SandboxError);
    expect(makeDir.message).toContain("read-only file system");
    expect(await sandbox.files.exists(existing)).toBe(true);
  });
});
