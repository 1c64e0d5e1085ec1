import { describe, expect, it } from "vitest";
import type { ClusterOptions } from "./cluster.js";
import { type ClusterLayout, ProcessEnv } from "./process-env.js";

const layout = {
  dataDir: "/tmp/warren-process-env",
  databaseUrl: "postgres://127.0.0.1:5432/test",
  dbSchema: "s",
  redisUrl: "redis://127.0.0.1:6379",
  secrets: { adminToken: "a", internalToken: "i", tokenSecret: "t" },
  masterPort: 1,
  apiPort: 2,
  proxyHost: "127.0.0.1",
  proxyPort: 3,
  tls: undefined,
  clientDomain: undefined,
  relayToken: undefined,
} as unknown as ClusterLayout;

const agentEnv = (options: ClusterOptions) => new ProcessEnv(options, layout).nodeAgent(0, "ta", 4);

describe("a node agent's environment in the local cluster", () => {
  it("sizes the warm pool from `poolSize`, 2 by default", () => {
    expect(agentEnv({}).WARREN_POOL_SIZE).toBe("2");
    expect(agentEnv({ poolSize: 0 }).WARREN_POOL_SIZE).toBe("0");
  });

  it("lets the caller's env size it too (a benchmark's --env WARREN_POOL_SIZE=100 was silently replaced by 2)", () => {
    expect(agentEnv({ env: { WARREN_POOL_SIZE: "100" } }).WARREN_POOL_SIZE).toBe("100");
    expect(agentEnv({ poolSize: 4, env: { WARREN_POOL_SIZE: "7", WARREN_POOL_MAX: "9" } })).toMatchObject({
      WARREN_POOL_SIZE: "7",
      WARREN_POOL_MAX: "9",
    });
  });

  it("has the agents also make `laterTemplates` at their first start, unless the caller's env lists what they make", () => {
    expect(agentEnv({}).WARREN_PREBUILD_TEMPLATES).toBeUndefined();
    expect(agentEnv({ laterTemplates: ["code-interpreter-v1"] }).WARREN_PREBUILD_TEMPLATES).toBe(
      "base,code-interpreter-v1",
    );
    expect(
      agentEnv({ laterTemplates: ["code-interpreter-v1"], env: { WARREN_PREBUILD_TEMPLATES: "base" } })
        .WARREN_PREBUILD_TEMPLATES,
    ).toBe("base");
  });
});
