import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseEnvFile, resolveConfig } from "../src/cli/config.js";
import { commandLine, keyValues } from "../src/cli/sandbox.js";

const project = mkdtempSync(join(tmpdir(), "warren-cli-config-"));
mkdirSync(join(project, ".warren"));
writeFileSync(
  join(project, ".warren", "env"),
  "# written by warren up\nE2B_API_URL=http://file-api\nE2B_API_KEY=file-key\nE2B_SANDBOX_URL=http://file-proxy\nWARREN_ADMIN_TOKEN=file-admin\n",
);
mkdirSync(join(project, "sub", "dir"), { recursive: true });
afterAll(() => rmSync(project, { recursive: true, force: true }));

describe("CLI configuration", () => {
  it("reads KEY=value env files, skipping comments, blank lines and `export`", () => {
    expect(parseEnvFile("# c\n\nexport A=1\nB=x=y\nnot a pair\n")).toEqual({ A: "1", B: "x=y" });
  });

  it("finds the nearest .warren/env above the working directory and takes every setting from it", () => {
    const config = resolveConfig({}, {}, join(project, "sub", "dir"));
    expect(config).toMatchObject({
      dataDir: join(project, ".warren"),
      apiUrl: "http://file-api",
      apiKey: "file-key",
      sandboxUrl: "http://file-proxy",
      adminToken: "file-admin",
      json: false,
    });
  });

  it("flags beat the environment, which beats the env file; WARREN_* beats E2B_*", () => {
    const env = { E2B_API_URL: "http://env-api", WARREN_API_KEY: "warren-key", E2B_API_KEY: "e2b-key" };
    const config = resolveConfig({ sandboxUrl: "http://flag-proxy", json: true }, env, project);
    expect(config).toMatchObject({
      apiUrl: "http://env-api",
      apiKey: "warren-key",
      sandboxUrl: "http://flag-proxy",
      adminToken: "file-admin",
      json: true,
    });
  });

  it("WARREN_DATA_DIR and --data-dir choose the data dir (and so the env file)", () => {
    const elsewhere = join(project, "sub");
    expect(resolveConfig({}, { WARREN_DATA_DIR: elsewhere }, project)).toMatchObject({
      dataDir: elsewhere,
      apiUrl: undefined,
    });
    expect(resolveConfig({ dataDir: project }, { WARREN_DATA_DIR: elsewhere }, project).dataDir).toBe(project);
  });
});

describe("exec arguments", () => {
  it("one argument is a shell command line; several are quoted word by word", () => {
    expect(commandLine(["echo $HOME && ls"])).toBe("echo $HOME && ls");
    expect(commandLine(["echo", "hello world", "it's", "$HOME", "-n"])).toBe(
      `echo 'hello world' 'it'\\''s' '$HOME' -n`,
    );
  });

  it("KEY=value flags become a record; anything else is a usage error", () => {
    expect(keyValues(["A=1", "B=x=y"], "--env")).toEqual({ A: "1", B: "x=y" });
    expect(() => keyValues(["novalue"], "--env")).toThrow("--env must be KEY=value, got 'novalue'");
  });
});
