import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "./config.js";

describe("config", () => {
  it("has E2B's defaults: port 49999, python and javascript contexts at start, cwd /home/user", () => {
    const config = loadConfig([], {});
    expect(config.port).toBe(49999);
    expect(config.host).toBe("127.0.0.1");
    expect(config.startLanguages).toEqual(["python", "javascript"]);
    expect(config.defaultCwd).toBe("/home/user");
    expect(config.pythonPath).toBe("/usr/bin/python3");
    expect(config.accessToken).toBeUndefined();
  });

  it("reads flags and env vars, the token from CODE_GATEWAY_ACCESS_TOKEN or ENVD_ACCESS_TOKEN", () => {
    const config = loadConfig(["--port", "0", "--host", "0.0.0.0"], {
      ENVD_ACCESS_TOKEN: "t1",
      CODE_GATEWAY_ENVD_URL: "http://10.0.0.1:49983/",
      CODE_GATEWAY_START_LANGUAGES: "python",
    });
    expect(config).toMatchObject({ port: 0, host: "0.0.0.0", accessToken: "t1", envdUrl: "http://10.0.0.1:49983" });
    expect(config.startLanguages).toEqual(["python"]);
    expect(loadConfig([], { CODE_GATEWAY_ACCESS_TOKEN: "t2", ENVD_ACCESS_TOKEN: "t1" }).accessToken).toBe("t2");
  });

  it("rejects bad values with a message naming the setting", () => {
    expect(() => loadConfig(["--port", "x"], {})).toThrow(ConfigError);
    expect(() => loadConfig([], { CODE_GATEWAY_KEEPALIVE_MS: "-1" })).toThrow(/CODE_GATEWAY_KEEPALIVE_MS/);
    expect(() => loadConfig([], { CODE_GATEWAY_ENVD_URL: "not a url" })).toThrow(/CODE_GATEWAY_ENVD_URL/);
    expect(() => loadConfig(["--bogus"], {})).toThrow(ConfigError);
  });
});
