import { execFileSync } from "node:child_process";
import { createSign, randomBytes, X509Certificate } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../src/node-agent/log.js";
import { type SnapshotParts, SnapshotStore } from "../src/node-agent/snapshot-store.js";
import { type LoopbackRegistry, startLoopbackRegistry } from "./loopback-registry.js";

// The snapshot store in a registry that takes Docker's token flow (how Docker Hub, GitLab, Harbor and most hosted
// registries authenticate): Debian's docker-registry with `auth: token`, and a token server of this test's own
// (the seam a registry's operator provides) that checks the store's credentials and signs a JWT with a
// certificate the registry trusts. The node agent's registry client (packs) and skopeo (shared layers, tags) both
// follow the registry's 401 challenge to the realm.
const root = mkdtempSync(join(tmpdir(), "warren-store-token-"));
const user = { username: "warren", password: "token-secret-0815" };
const SERVICE = "warren-test-registry";
const ISSUER = "warren-test-issuer";
const log = createLogger("snapshot-store-token-test", { level: "error" });
/**
 * Every token request: the user its basic credentials named (undefined: none or wrong), its service and scopes,
 * and who asked (Warren's registry client, or skopeo).
 */
const requests: { user: string | undefined; service: string | null; scopes: string[]; agent: string }[] = [];
let tokenServer: Server;
let registry: LoopbackRegistry;

function base64url(value: unknown): string {
  return Buffer.from(JSON.stringify(value)).toString("base64url");
}

/** A JWT as distribution verifies it: RS256, the signing certificate in `x5c`, claims for the granted scopes. */
function signToken(key: string, cert: string, subject: string, scopes: string[]): string {
  const now = Math.floor(Date.now() / 1000);
  const access = scopes.flatMap((scope) => {
    const [type, name, actions] = scope.split(":");
    return type === "repository" && name && actions ? [{ type, name, actions: actions.split(",") }] : [];
  });
  const header = { alg: "RS256", typ: "JWT", x5c: [new X509Certificate(cert).raw.toString("base64")] };
  const claims = {
    iss: ISSUER,
    sub: subject,
    aud: SERVICE,
    exp: now + 300,
    nbf: now - 10,
    iat: now,
    jti: randomBytes(8).toString("hex"),
    access,
  };
  const input = `${base64url(header)}.${base64url(claims)}`;
  return `${input}.${createSign("RSA-SHA256").update(input).sign(key).toString("base64url")}`;
}

beforeAll(async () => {
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-days",
      "1",
      "-subj",
      "/CN=warren-test-token",
      "-keyout",
      join(root, "token.key"),
      "-out",
      join(root, "token.crt"),
    ],
    { stdio: "ignore" },
  );
  const key = readFileSync(join(root, "token.key"), "utf8");
  const cert = readFileSync(join(root, "token.crt"), "utf8");
  tokenServer = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://token");
    const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    const [name, password] = basic ? Buffer.from(basic, "base64").toString().split(":") : [];
    const ok = name === user.username && password === user.password;
    requests.push({
      user: ok ? name : undefined,
      service: url.searchParams.get("service"),
      scopes: url.searchParams.getAll("scope"),
      agent: req.headers["user-agent"] ?? "",
    });
    if (!ok) {
      res.writeHead(401, { "content-type": "application/json" }).end('{"details":"incorrect username or password"}');
      return;
    }
    const token = signToken(key, cert, user.username, url.searchParams.getAll("scope"));
    res
      .writeHead(200, { "content-type": "application/json" })
      .end(JSON.stringify({ token, access_token: token, expires_in: 300 }));
  });
  await new Promise<void>((resolve) => tokenServer.listen(0, "127.0.0.1", resolve));
  const { port } = tokenServer.address() as AddressInfo;
  registry = await startLoopbackRegistry(join(root, "registry"), {
    token: {
      realm: `http://127.0.0.1:${port}/token`,
      service: SERVICE,
      issuer: ISSUER,
      rootCertBundle: join(root, "token.crt"),
    },
  });
});

afterAll(async () => {
  registry?.process.kill("SIGKILL");
  await new Promise((resolve) => tokenServer?.close(resolve));
  rmSync(root, { recursive: true, force: true });
});

const store = (password: string, work: string) =>
  new SnapshotStore(
    { url: `docker://${registry.host}/warren`, insecure: true, username: user.username, password },
    join(root, work),
    log,
  );

/** A snapshot with a shared layer: the own part goes in as packs (registry client), the layer through skopeo. */
function parts(own: Buffer, layer: string): SnapshotParts {
  return {
    own: async function* () {
      yield own;
    },
    layers: ["ltoken"],
    layer: async function* () {
      yield Buffer.from(layer);
    },
  };
}

async function read(data: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of data) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}

describe("a registry store behind Docker's token flow", () => {
  it("the registry itself refuses a request without a token and names its realm", async () => {
    const res = await fetch(`http://${registry.host}/v2/warren/snapshots/tags/list`);
    expect(res.status).toBe(401);
    expect(res.headers.get("www-authenticate")).toMatch(/^Bearer realm="http:\/\/127\.0\.0\.1:\d+\/token"/);
  });

  it("publishes and pulls with tokens from the realm, asked for with the store's credentials and scope", async () => {
    const own = randomBytes(256 * 1024);
    const published = await store(user.password, "work-a").publish("ttoken", parts(own, "layer bytes"), {});
    const pulled = await store(user.password, "work-b").pull("ttoken", published.digest, () => false, read);
    // The stream is the own part, then the layer's content as its tar the node would import: checked, in order.
    expect(pulled.result.subarray(0, own.length).equals(own)).toBe(true);
    expect(pulled.result.subarray(own.length).toString()).toBe("layer bytes");
    expect(requests.length).toBeGreaterThan(0);
    expect(requests.every((r) => r.user === user.username && r.service === SERVICE)).toBe(true);
    // Both clients followed the challenge: Warren's own (packs) and skopeo (the shared layer, the tag list).
    expect(requests.some((r) => r.agent === "warren-node-agent")).toBe(true);
    expect(requests.some((r) => r.agent.startsWith("skopeo/"))).toBe(true);
    const scopes = new Set(requests.flatMap((r) => r.scopes));
    expect(scopes).toContain("repository:warren/snapshots:pull,push");
  });

  it("a wrong password fails at the token server with its answer, never the password", async () => {
    const before = requests.length;
    const failed = await store("not-the-password", "work-wrong")
      .publish("twrong", parts(randomBytes(1000), "x"), {})
      .then(
        () => undefined,
        (error: Error) => error,
      );
    expect(failed?.message).toMatch(/401|unauthorized|incorrect/i);
    expect(failed?.message).not.toContain("not-the-password");
    expect(requests.slice(before).some((r) => r.user === undefined)).toBe(true);
    expect(await store(user.password, "work-a").listPublished()).not.toContain("twrong");
  });
});
