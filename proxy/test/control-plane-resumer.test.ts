import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../src/config.js";
import { ControlPlaneResumer } from "../src/control-plane-resumer.js";
import { ResumeError } from "../src/resume.js";

const TOKEN = "internal-token-0123456789";

/** A stand-in for the api's internal endpoint: answers with the status the sandbox id names. */
describe("ControlPlaneResumer: the proxy's call to the api's internal resume endpoint", () => {
  let server: Server;
  let url = "";
  const seen: { path: string; token: string | undefined; body: unknown }[] = [];

  beforeAll(async () => {
    server = createServer(async (req: IncomingMessage, res) => {
      let text = "";
      for await (const chunk of req) text += chunk;
      seen.push({
        path: req.url ?? "",
        token: req.headers["x-warren-internal-token"] as string,
        body: JSON.parse(text),
      });
      const status = Number(/\/sandboxes\/s(\d+)\//.exec(req.url ?? "")?.[1] ?? 500);
      res
        .writeHead(status, { "Content-Type": "application/json" })
        .end(JSON.stringify({ message: `answer ${status}` }));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const resume = (sandboxId: string) =>
    new ControlPlaneResumer({ url, token: TOKEN }).resume({
      sandboxId,
      exec: "e1",
      port: 8000,
      trafficAccessToken: "traffic",
      envdAccessToken: undefined,
      signal: AbortSignal.timeout(5_000),
    });

  it("posts the port and the client's tokens with the internal token, and resolves on 200", async () => {
    await resume("s200");
    expect(seen.at(-1)).toEqual({
      path: "/warren/v1/internal/sandboxes/s200/resume",
      token: TOKEN,
      body: { port: 8000, trafficAccessToken: "traffic", envdAccessToken: "" },
    });
  });

  it.each([
    ["s404", "not-found"],
    ["s403", "forbidden"],
    ["s409", "transitioning"],
    ["s429", "limit"],
  ])("maps %s to the refusal %s", async (sandboxId, refusal) => {
    const error = await resume(sandboxId).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ResumeError);
    expect(error).toMatchObject({ refusal, message: `answer ${sandboxId.slice(1)}` });
  });

  it("rejects other failures as plain errors (the proxy answers them as not found)", async () => {
    const error = await resume("s503").catch((e: unknown) => e);
    expect(error).not.toBeInstanceOf(ResumeError);
    expect(String(error)).toMatch(/503/);
  });

  it("is configured by PROXY_RESUME_URL and WARREN_INTERNAL_TOKEN together, or not at all", () => {
    const quiet = () => undefined;
    expect(loadConfig({}, 1, quiet).internalApi).toBeUndefined();
    expect(loadConfig({ PROXY_RESUME_URL: url, WARREN_INTERNAL_TOKEN: TOKEN }, 1, quiet).internalApi).toEqual({
      url,
      token: TOKEN,
    });
    expect(() => loadConfig({ PROXY_RESUME_URL: url }, 1, quiet)).toThrow(/together/);
    expect(() => loadConfig({ PROXY_RESUME_URL: url, WARREN_INTERNAL_TOKEN: "short" }, 1, quiet)).toThrow(/16/);
    expect(() => loadConfig({ PROXY_RESUME_URL: "not a url", WARREN_INTERNAL_TOKEN: TOKEN }, 1, quiet)).toThrow(/URL/);
  });

  it("still reads the token under its old name, PROXY_RESUME_TOKEN, with a warning", () => {
    const warnings: string[] = [];
    const config = loadConfig({ PROXY_RESUME_URL: url, PROXY_RESUME_TOKEN: TOKEN }, 1, (m) => warnings.push(m));
    expect(config.internalApi?.token).toBe(TOKEN);
    expect(warnings).toEqual([
      "PROXY_RESUME_TOKEN is deprecated and will stop working in the next release; set WARREN_INTERNAL_TOKEN instead",
    ]);
  });
});
