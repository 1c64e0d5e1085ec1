import { describe, expect, it } from "vitest";
import { ConfigError, loadNodeAgentConfig } from "./config.js";

describe("node agent config", () => {
  it("has documented defaults", () => {
    const config = loadNodeAgentConfig({ WARREN_NODE_ID: "node1" });
    expect(config).toMatchObject({
      nodeId: "node1",
      listenHost: "127.0.0.1",
      listenPort: 49700,
      nodeAddr: "127.0.0.1:49700",
      redisUrl: "redis://127.0.0.1:6379",
      stateDir: "/var/lib/warren/agent-a",
      templatesDir: "/var/lib/warren/templates",
      netCidr: "10.201.0.0/16",
      poolSize: 2,
      poolMax: 32,
      poolWindowMs: 60_000,
      poolRefill: 2,
      maxQueuedStarts: 256,
      poolTemplates: ["base"],
      uidBase: 100000,
    });
  });

  it("rejects invalid values with a message naming the variable and the value", () => {
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "Bad Id" })).toThrow(/WARREN_NODE_ID 'Bad Id'/);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_POOL_SIZE: "-1" })).toThrow(ConfigError);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_POOL_REFILL: "0" })).toThrow(/WARREN_POOL_REFILL/);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_POOL_WINDOW_MS: "10" })).toThrow(
      /WARREN_POOL_WINDOW_MS/,
    );
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_AGENT_LISTEN: "nope" })).toThrow(/host:port/);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_INSTANCE: "toolong" })).toThrow(/WARREN_INSTANCE/);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_UID_BASE: "0" })).toThrow(/WARREN_UID_BASE/);
    expect(() => loadNodeAgentConfig({ WARREN_NODE_ID: "n", WARREN_SHARE_SHIPPED_TEMPLATES: "yes" })).toThrow(
      /WARREN_SHARE_SHIPPED_TEMPLATES must be auto, on or off, got 'yes'/,
    );
  });

  it("shares shipped templates through a registry store by default, not through a directory", () => {
    const share = (env: Record<string, string>) =>
      loadNodeAgentConfig({ WARREN_NODE_ID: "n", ...env }).shareShippedTemplates;
    expect(share({})).toBe(false);
    expect(share({ WARREN_STORE: "docker://127.0.0.1:5000/warren" })).toBe(true);
    expect(share({ WARREN_STORE: "docker://127.0.0.1:5000/warren", WARREN_SHARE_SHIPPED_TEMPLATES: "off" })).toBe(
      false,
    );
    expect(share({ WARREN_STORE: "oci:/shared/store", WARREN_SHARE_SHIPPED_TEMPLATES: "on" })).toBe(true);
  });
});
