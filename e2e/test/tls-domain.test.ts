import { execFile } from "node:child_process";
import { randomBytes, randomInt } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { LocalCluster } from "@warren/local";
import { makeTestCertificates } from "@warren/local/test-certificates";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// E2B's own layout end to end: the official e2b SDK with only E2B_DOMAIN (no E2B_API_URL, no E2B_SANDBOX_URL)
// reaches the api at https://api.<domain> and sandboxes at https://<port>-<id>.<domain>, through the proxy's TLS
// listener and a test CA. The SDK runs in its own process (tls-domain-sdk.mjs) that trusts the CA and resolves
// *.<domain> to the proxy's loopback address (loopback-dns); every other name fails there, so no traffic leaves
// the machine. The cluster also runs under a WARREN_REDIS_PREFIX, which master, node agent and proxy must share.

const E2E_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const DOMAIN = "warren.test"; // RFC 2606: never a real domain
const REDIS_PREFIX = `wt-${randomBytes(4).toString("hex")}:`;
const dataDir = mkdtempSync(join(tmpdir(), "warren-e2e-tls-"));
// A loopback address of its own (Linux routes all of 127/8 to lo): the proxy can take port 443 there without
// colliding with anything on 127.0.0.1, so the SDK's URLs carry no port, exactly as against E2B.
const proxyHost = `127.${randomInt(1, 255)}.${randomInt(0, 256)}.${randomInt(1, 255)}`;
const certificates = makeTestCertificates(join(dataDir, "tls"), DOMAIN);

let cluster: LocalCluster;
let clientDomain = "";
let apiKey = "";

/** 443 when it is free on `host` (we run as root), else any free port (the domain then carries `:<port>`). */
async function proxyPortOn(host: string): Promise<number> {
  const tryListen = (port: number) =>
    new Promise<number | undefined>((done) => {
      const server = createServer();
      server.once("error", () => done(undefined));
      server.listen(port, host, () => {
        const address = server.address();
        server.close(() => done(typeof address === "object" && address ? address.port : undefined));
      });
    });
  return (await tryListen(443)) ?? (await tryListen(0)) ?? 0;
}

interface SdkRun {
  readonly [key: string]: unknown;
}

/** Runs tls-domain-sdk.mjs in a Node process of its own and returns the JSON line it prints. */
function runSdk(mode: "scenario" | "untrusted" | "template", trustCa: boolean): Promise<SdkRun> {
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    E2B_DOMAIN: clientDomain,
    E2B_API_KEY: apiKey,
    WARREN_LOOPBACK_DOMAIN: DOMAIN,
    WARREN_LOOPBACK_ADDRESS: proxyHost,
    ...(trustCa ? { NODE_EXTRA_CA_CERTS: certificates.caFile } : {}),
  };
  const args = ["--import", join(E2E_DIR, "dist/loopback-dns.js"), join(E2E_DIR, "test/tls-domain-sdk.mjs"), mode];
  return new Promise((done, fail) => {
    execFile(process.execPath, args, { env, cwd: E2E_DIR, timeout: 150_000 }, (error, stdout, stderr) => {
      const line = stdout.trim().split("\n").at(-1) ?? "";
      if (error || !line.startsWith("{")) {
        fail(new Error(`SDK process failed (${error?.message ?? "no result"}):\n${stderr}\n${stdout}`));
        return;
      }
      done(JSON.parse(line) as SdkRun);
    });
  });
}

beforeAll(async () => {
  const proxyPort = await proxyPortOn(proxyHost);
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    // "tla": node-agent tests own ta–td.
    instancePrefix: "tl",
    nodeCidr: () => "10.219.0.0/16",
    proxyHost,
    proxyPort,
    tls: { domain: DOMAIN, ...certificates },
    env: { WARREN_REDIS_PREFIX: REDIS_PREFIX },
  });
  const env = await cluster.start();
  clientDomain = env.E2B_DOMAIN ?? "";
  apiKey = env.E2B_API_KEY;
}, 900_000);

afterAll(async () => {
  await cluster?.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("E2B_DOMAIN routing over TLS through the whole cluster", () => {
  it("the e2b SDK with only E2B_DOMAIN creates, runs, writes and reads, uses signed URLs and getHost, and kills", async () => {
    const out = await runSdk("scenario", true);
    const id = out.sandboxId as string;
    expect(id).toMatch(/^[a-z0-9]+$/);
    // The URLs the SDK built from the domain (the master hands the same domain back in create's `domain`).
    expect(out.apiUrl).toBe(`https://api.${clientDomain}`);
    expect(out.sandboxDomain).toBe(clientDomain);
    expect(out.envdApiUrl).toBe(`https://49983-${id}.${clientDomain}`);

    expect(out.run).toEqual({ exitCode: 0, stdout: "hello from user\n" });
    expect(out.read).toBe("written over tls");

    const download = new URL(out.downloadUrl as string);
    expect(download.origin).toBe(`https://49983-${id}.${clientDomain}`);
    expect(download.searchParams.get("signature")).toMatch(/^v1_/);
    expect(out.download).toEqual({ status: 200, body: "written over tls" });
    expect(new URL(out.uploadUrl as string).origin).toBe(`https://49983-${id}.${clientDomain}`);
    expect(out.upload).toMatchObject({ status: 200 });
    expect(out.uploadedRead).toBe("uploaded over tls");

    expect(out.host8000).toBe(`8000-${id}.${clientDomain}`);
    expect(out.port8000).toEqual({ status: 200, body: "written over tls" });

    expect(out.killed).toBe(true);
    expect(out.runningAfterKill).toBe(false);
    expect(out.downloadAfterKill).toMatchObject({ status: 502 });
    expect(JSON.parse((out.downloadAfterKill as { body: string }).body)).toEqual({
      sandboxId: id,
      message: "The sandbox was not found",
      code: 502,
    });
  }, 180_000);

  it("a template's COPY step uploads its files through https://api.<domain> (the link the api hands out)", async () => {
    const out = await runSdk("template", true);
    expect(out.error).toBeUndefined();
    // Built from Host and the scheme the proxy tells the api: never the api's own plain-HTTP address.
    expect(out.uploadLink).toMatchObject({ status: 201 });
    expect(new URL((out.uploadLink as { url: string }).url).origin).toBe(`https://api.${clientDomain}`);
    expect(out.copied).toBe("copied over tls\n");
  }, 180_000);

  it("an SDK that does not trust the CA gets no answer from api.<domain>", async () => {
    const out = await runSdk("untrusted", false);
    expect(out.listed).toBe(false);
    // The proxy sends only its leaf certificate; without the CA, Node cannot verify it.
    expect(out.cause).toBe("UNABLE_TO_VERIFY_LEAF_SIGNATURE");
  }, 60_000);

  it("keeps every Redis key and the route-events channel under WARREN_REDIS_PREFIX", async () => {
    const redis = new Redis(cluster.redisUrl, { maxRetriesPerRequest: 1 });
    try {
      const keys = await redis.keys("*");
      expect(keys).toContain(`${REDIS_PREFIX}warren:nodes`);
      expect(keys.filter((key) => !key.startsWith(REDIS_PREFIX))).toEqual([]);
      const channels = (await redis.pubsub("CHANNELS", "*")) as string[];
      expect(channels).toContain(`${REDIS_PREFIX}warren:route-events`);
      expect(channels).not.toContain("warren:route-events");
    } finally {
      redis.disconnect();
    }
  });
});
