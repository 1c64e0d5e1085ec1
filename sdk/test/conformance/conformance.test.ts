import { Sandbox as CodeInterpreterSandbox } from "@e2b/code-interpreter";
import { Sandbox as E2BSandbox } from "e2b";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { startTestGateway, type TestGateway } from "../../../code-gateway/test/harness.js";
import { RouteWriter, randomSandboxId, startTestProxy, type TestProxy } from "../../../proxy/test/harness.js";
import { Sandbox } from "../../src/index.js";
import { ENVD_VERSION, scratch, startEnvd, type TestEnvd, until } from "../harness.js";
import {
  type CommonCodeSandbox,
  type CommonSandbox,
  codeScenarios,
  commandScenarios,
  fileScenarios,
  ptyScenarios,
  type ScenarioContext,
} from "./scenarios.js";

const TOKEN = "conformance-token";
let envd: TestEnvd;
let gateway: TestGateway;
let proxy: TestProxy;
let routes: RouteWriter;
const proxiedId = randomSandboxId();

beforeAll(async () => {
  envd = await startEnvd({ accessToken: TOKEN });
  gateway = await startTestGateway({ accessToken: TOKEN });
  routes = new RouteWriter();
  proxy = await startTestProxy();
  await routes.write({
    sandboxId: proxiedId,
    sandboxAddr: "127.0.0.1",
    ports: { "49983": `127.0.0.1:${envd.port}`, "49999": `127.0.0.1:${gateway.port}` },
  });
}, 90_000);
afterAll(async () => {
  await proxy?.close();
  await routes?.cleanup();
  await gateway?.stop();
  await envd?.stop();
});

interface Target {
  sandboxId: string;
  envdUrl(): string;
  gatewayUrl(): string;
}

// The same scenarios against envd directly and through the real proxy (header routing).
const targets: Record<string, Target> = {
  "envd directly": { sandboxId: "conformance", envdUrl: () => envd.url, gatewayUrl: () => gateway.url },
  "through the proxy": { sandboxId: proxiedId, envdUrl: () => proxy.url, gatewayUrl: () => proxy.url },
};

/** The official SDK bound to a server the way its own local mode does (sandboxUrl + debug). */
function officialSandbox<T>(SandboxClass: unknown, sandboxId: string, url: string): T {
  const Ctor = SandboxClass as new (opts: Record<string, unknown>) => T;
  return new Ctor({ sandboxId, envdVersion: ENVD_VERSION, envdAccessToken: TOKEN, sandboxUrl: url, debug: true });
}

function warren(sandboxId: string, url: string): Sandbox {
  return new Sandbox({ sandboxId, envdVersion: ENVD_VERSION, envdAccessToken: TOKEN, sandboxUrl: url });
}

/** Runs a scenario with a fresh directory and replaces that directory in the result. */
async function normalized<S>(scenario: (s: S, ctx: ScenarioContext) => Promise<unknown>, sandbox: S): Promise<unknown> {
  const dir = scratch("conf");
  const result = await scenario(sandbox, { dir, until });
  return JSON.parse(JSON.stringify(result ?? null).replaceAll(dir, "<dir>"));
}

for (const [where, target] of Object.entries(targets)) {
  describe(`conformance (${where}): the same scenarios with Warren's SDK and the official e2b SDK`, () => {
    for (const [name, scenario] of Object.entries({ ...commandScenarios, ...fileScenarios, ...ptyScenarios })) {
      test(`${name} gives the same result with both SDKs`, async () => {
        const ours = await normalized(scenario, warren(target.sandboxId, target.envdUrl()) as unknown as CommonSandbox);
        const theirs = await normalized(
          scenario,
          officialSandbox<CommonSandbox>(E2BSandbox, target.sandboxId, target.envdUrl()),
        );
        expect(ours).toEqual(theirs);
      });
    }

    for (const [name, scenario] of Object.entries(codeScenarios)) {
      test(`code: ${name} gives the same result with both SDKs`, async () => {
        const ours = await normalized(
          scenario,
          warren(target.sandboxId, target.gatewayUrl()) as unknown as CommonCodeSandbox,
        );
        const theirs = await normalized(
          scenario,
          officialSandbox<CommonCodeSandbox>(CodeInterpreterSandbox, target.sandboxId, target.gatewayUrl()),
        );
        expect(ours).toEqual(theirs);
      });
    }
  });
}
