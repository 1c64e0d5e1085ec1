import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { Artifacts, InvalidArgumentError, SandboxError } from "../src/index.js";
import { cleanEnv, warren } from "./cli-harness.js";
import { json, type RecordingServer, startRecordingServer } from "./harness.js";

let api: RecordingServer;
beforeAll(async () => {
  api = await startRecordingServer();
});
afterEach(() => {
  api.requests.length = 0;
});
afterAll(async () => {
  await api?.close();
});

const ARTIFACT = {
  artifactID: "art_0123456789abcdef01234567",
  sandboxID: "isbx1",
  path: "/home/user/out",
  format: "zip",
  sizeBytes: 3,
  sha256: "a".repeat(64),
  createdAt: "2026-12-01T00:00:00.000Z",
};
const opts = () => ({ apiKey: "key-1", apiUrl: api.url });

describe("artifacts (against a recording server; e2e/test/artifacts.test.ts runs the real api)", () => {
  test("publish sends the path and format to the sandbox's artifacts and reads the artifact back", async () => {
    api.handle((_req, res) => json(res, 201, ARTIFACT));
    const info = await new Artifacts(opts(), "isbx1").publish("/home/user/out", { format: "zip" });
    expect(info).toEqual({
      artifactId: ARTIFACT.artifactID,
      sandboxId: "isbx1",
      path: "/home/user/out",
      format: "zip",
      sizeBytes: 3,
      sha256: ARTIFACT.sha256,
      createdAt: new Date(ARTIFACT.createdAt),
    });
    const [req] = api.requests;
    expect(req?.method).toBe("POST");
    expect(req?.url).toBe("/warren/v1/sandboxes/isbx1/artifacts");
    expect(req?.headers["x-api-key"]).toBe("key-1");
    expect(JSON.parse(req?.body ?? "")).toEqual({ path: "/home/user/out", format: "zip" });
  });

  test("a relative path is refused before any request; publish needs a sandbox", async () => {
    await expect(new Artifacts(opts(), "isbx1").publish("out")).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(new Artifacts(opts()).publish("/out")).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(api.requests).toHaveLength(0);
  });

  test("list is the sandbox's on a bound instance and the team's otherwise", async () => {
    api.handle((_req, res) => json(res, 200, [ARTIFACT]));
    expect(await new Artifacts(opts(), "isbx1").list()).toHaveLength(1);
    expect(await new Artifacts(opts()).list()).toHaveLength(1);
    expect(api.requests.map((r) => r.url)).toEqual(["/warren/v1/sandboxes/isbx1/artifacts", "/warren/v1/artifacts"]);
  });

  test("download asks for a signed URL, then fetches it without the API key", async () => {
    api.handle((req, res) => {
      if (req.method === "POST") {
        json(res, 201, {
          path: "/warren/v1/artifacts/art_x/download?expires=9&sig=s",
          expiresAt: "2026-12-01T00:05:00Z",
        });
      } else {
        res.writeHead(200, { "Content-Type": "application/zip" }).end(Buffer.from([1, 2, 3]));
      }
    });
    const bytes = await new Artifacts(opts()).download("art_x");
    expect([...bytes]).toEqual([1, 2, 3]);
    const [sign, get] = api.requests;
    expect(sign?.url).toBe("/warren/v1/artifacts/art_x/url");
    expect(JSON.parse(sign?.body ?? "")).toEqual({ expiresInSeconds: 300 });
    expect(get?.url).toBe("/warren/v1/artifacts/art_x/download?expires=9&sig=s");
    expect(get?.headers["x-api-key"]).toBeUndefined();
  });

  test("delete is false for a 404 and a refused download is an error with its message", async () => {
    api.handle((req, res) => {
      if (req.method === "DELETE") json(res, 404, { code: 404, message: "artifact 'art_x' not found" });
      else if (req.method === "POST") json(res, 201, { path: "/dl", expiresAt: "2026-12-01T00:05:00Z" });
      else json(res, 403, { code: 403, message: "download URL expired at 2026-12-01T00:00:00.000Z" });
    });
    const artifacts = new Artifacts(opts());
    expect(await artifacts.delete("art_x")).toBe(false);
    const refused = artifacts.download("art_x");
    await expect(refused).rejects.toBeInstanceOf(SandboxError);
    await expect(refused).rejects.toThrow(/expired/);
  });

  test("the CLI: `sandbox publish ID PATH` prints the id, `artifact url|rm` sign and delete, usage errors exit 2", async () => {
    api.handle((req, res) => {
      if (req.url.endsWith("/artifacts")) json(res, 201, ARTIFACT);
      else if (req.url.endsWith("/url")) json(res, 201, { path: "/dl?sig=s", expiresAt: "2026-12-01T00:05:00Z" });
      else res.writeHead(204).end();
    });
    const env = cleanEnv({ WARREN_API_URL: api.url, WARREN_API_KEY: "key-1", WARREN_DATA_DIR: "/nonexistent" });
    const published = await warren(["sandbox", "publish", "isbx1", "/home/user/out", "--format", "zip"], env);
    expect(published.code, published.stderr).toBe(0);
    expect(published.stdout.trim()).toBe(ARTIFACT.artifactID);
    expect(JSON.parse(api.requests[0]?.body ?? "")).toEqual({ path: "/home/user/out", format: "zip" });
    const url = await warren(["artifact", "url", "art_x", "--expires", "60", "--json"], env);
    expect(JSON.parse(url.stdout)).toEqual({ url: `${api.url}/dl?sig=s`, expiresAt: "2026-12-01T00:05:00.000Z" });
    expect(JSON.parse(api.requests[1]?.body ?? "")).toEqual({ expiresInSeconds: 60 });
    const removed = await warren(["artifact", "rm", "art_x"], env);
    expect(removed.stdout.trim()).toBe("deleted art_x");
    expect(api.requests[2]?.method).toBe("DELETE");
    const bad = await warren(["sandbox", "publish", "isbx1", "/x", "--format", "rar"], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--format must be tar or zip");
  });
});
