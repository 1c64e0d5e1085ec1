import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, expect, it } from "vitest";
import { AccessCheck } from "./access.js";
import { EnvdEnvironment } from "./envs.js";
import { silentLogger } from "./log.js";

// envd's side of GET /envs, as envd answers it: 200 with the env vars for its token, 401 for any other.
let server: Server | undefined;
afterEach(() => {
  server?.close();
  server?.closeAllConnections();
});

async function envdStandIn(token: string, envVars: Record<string, string>) {
  const asked: (string | undefined)[] = [];
  server = createServer((req, res) => {
    const given = req.headers["x-access-token"] as string | undefined;
    asked.push(given);
    if (req.url !== "/envs" || given !== token) return res.writeHead(401).end();
    res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(envVars));
  });
  await new Promise<void>((resolve) => server?.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, asked };
}

const requestWith = (token: string) => ({ headers: { "x-access-token": token } }) as unknown as IncomingMessage;

it("a sandbox's first execution asks envd once: the access check's answer carries the env vars", async () => {
  const envd = await envdStandIn("tok", { E2B_SANDBOX: "true", MINE: "1" });
  const environment = new EnvdEnvironment(envd.url, 2000, silentLogger);
  const access = new AccessCheck({ fixedToken: undefined, envd: environment, envdTimeoutMs: 2000, log: silentLogger });
  try {
    await access.check(requestWith("tok"));
    expect(await environment.fetch("tok")).toEqual({ E2B_SANDBOX: "true", MINE: "1" });
    expect(envd.asked).toEqual(["tok"]);
    // A wrong token is refused and gets no env vars kept for another token.
    await expect(access.check(requestWith("wrong"))).rejects.toMatchObject({ status: 401 });
    expect(await environment.fetch("wrong")).toEqual({});
    expect(envd.asked).toEqual(["tok", "wrong", "wrong"]);
  } finally {
    environment.close();
  }
});

it("without a fresh answer, fetch asks envd itself; an envd that is gone gives no env vars, not an error", async () => {
  const envd = await envdStandIn("tok", { A: "b" });
  const environment = new EnvdEnvironment(envd.url, 2000, silentLogger);
  try {
    expect(await environment.fetch("tok")).toEqual({ A: "b" });
    expect(envd.asked).toEqual(["tok"]);
    server?.close();
    server?.closeAllConnections();
    const gone = new EnvdEnvironment("http://127.0.0.1:9", 500, silentLogger);
    expect(await gone.fetch("tok")).toEqual({});
    gone.close();
  } finally {
    environment.close();
  }
});
