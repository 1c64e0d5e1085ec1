import { request } from "node:http";
import { create, toJson } from "@bufbuild/protobuf";
import { StartRequestSchema } from "@warren/proto/process/process_pb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SECRET_ENV_HEADER, SECRET_GRANT_HEADER, type SecretGrantRedeemer, START_PATH } from "../src/secret-grants.js";
import {
  RouteWriter,
  randomSandboxId,
  startTestProxy,
  startUpstream,
  type TestProxy,
  type Upstream,
  waitUntil,
} from "./harness.js";

// The proxy redeems a Start's secret grant before it forwards the Start: the redemption is cancelled when the client
// goes away meanwhile, and left alone once the Start has gone on (the redeemer is a stand-in at a seam the proxy owns;
// the api's real redemption runs in e2e/test/harness.test.ts).

/** A redeemer whose redemptions wait until the test lets them go, keeping each one's signal. */
class HeldRedeemer implements SecretGrantRedeemer {
  readonly signals: AbortSignal[] = [];
  private release: (() => void) | undefined;

  redeem(_sandboxId: string, _grant: string, signal?: AbortSignal): Promise<Record<string, string>> {
    if (!signal) throw new Error("the proxy gave no signal");
    this.signals.push(signal);
    return new Promise((resolve, reject) => {
      this.release = () => resolve({ API_TOKEN: "s3cret-value" });
      signal.addEventListener("abort", () => reject(signal.reason), { once: true });
    });
  }

  letGo(): void {
    this.release?.();
  }
}

function startBody(): Buffer {
  const message = create(StartRequestSchema, { process: { cmd: "/bin/bash", args: ["-l", "-c", "true"] } });
  const payload = Buffer.from(JSON.stringify(toJson(StartRequestSchema, message)));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(payload.length, 1);
  return Buffer.concat([head, payload]);
}

let proxy: TestProxy;
let routes: RouteWriter;
let upstream: Upstream;
const redeemer = new HeldRedeemer();
const startsSeen: { secretEnv: string | undefined }[] = [];

beforeAll(async () => {
  routes = new RouteWriter();
  upstream = await startUpstream((req, res) => {
    req.resume();
    req.on("end", () => {
      startsSeen.push({ secretEnv: req.headers[SECRET_ENV_HEADER] as string | undefined });
      res.writeHead(200, { "Content-Type": "application/connect+json" });
      res.end();
    });
  });
  proxy = await startTestProxy({ PROXY_DOMAINS: "warren.test" }, { secretGrants: redeemer });
});

afterAll(async () => {
  await upstream.close();
  await proxy.close();
  await routes.cleanup();
});

async function sandboxHost(): Promise<string> {
  const sandboxId = randomSandboxId();
  await routes.write({ sandboxId, sandboxAddr: "127.0.0.1", ports: { "49983": `127.0.0.1:${upstream.port}` } });
  return `49983-${sandboxId}.warren.test`;
}

/** Posts a Start with a grant; `reply` settles with the status when the answer has been read. */
function postStart(host: string) {
  const req = request({
    host: "127.0.0.1",
    port: proxy.port,
    method: "POST",
    path: START_PATH,
    headers: { Host: host, "Content-Type": "application/connect+json", [SECRET_GRANT_HEADER]: "grant-1" },
    agent: false,
  });
  const reply = new Promise<number>((resolve, reject) => {
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
  });
  reply.catch(() => undefined);
  req.end(startBody());
  return { req, reply };
}

describe("a Start with a secret grant", () => {
  it("goes on with the secrets once redeemed, and its redemption is not aborted when the exchange ends", async () => {
    const host = await sandboxHost();
    const before = startsSeen.length;
    const { reply } = postStart(host);
    await waitUntil(() => redeemer.signals.length === 1, "the redemption");
    redeemer.letGo();
    expect(await reply).toBe(200);
    expect(startsSeen.length).toBe(before + 1);
    const secretEnv = startsSeen.at(-1)?.secretEnv ?? "";
    expect(JSON.parse(Buffer.from(secretEnv, "base64").toString())).toEqual({ API_TOKEN: "s3cret-value" });
    expect(proxy.logs()).not.toContain("s3cret-value");
    // The exchange is over and its connection closed: nothing is left to cancel, and nothing was.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(redeemer.signals[0]?.aborted).toBe(false);
  });

  it("is cancelled when its client goes away while the grant is redeemed", async () => {
    const host = await sandboxHost();
    const before = startsSeen.length;
    const index = redeemer.signals.length;
    const { req } = postStart(host);
    await waitUntil(() => redeemer.signals.length === index + 1, "the redemption");
    req.destroy();
    await waitUntil(() => redeemer.signals[index]?.aborted === true, "the redemption's cancellation");
    expect(startsSeen.length).toBe(before);
  });
});
