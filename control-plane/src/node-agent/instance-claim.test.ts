import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ConfigError } from "./config.js";
import { claimInstance } from "./instance-claim.js";

describe("instance claims", () => {
  it("one agent per instance name: a second claim is refused naming the holder, other names and a released one are free", async () => {
    const dir = mkdtempSync(join(tmpdir(), "claims-"));
    const first = await claimInstance("sa", dir);
    expect(readFileSync(join(dir, "sa.pid"), "utf8").trim()).toBe(String(process.pid));
    const refused = await claimInstance("sa", dir, 200).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(ConfigError);
    expect(String(refused)).toMatch(
      new RegExp(`another node agent on this host \\(pid ${process.pid}\\) runs instance 'sa'`),
    );
    expect(String(refused)).toMatch(/WARREN_INSTANCE/);
    const other = await claimInstance("sb", dir);
    await first.release();
    const again = await claimInstance("sa", dir);
    await Promise.all([other.release(), again.release()]);
  });
});
