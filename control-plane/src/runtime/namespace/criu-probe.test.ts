import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { criuProbeFile, probeCriu } from "./criu-probe.js";

// The probe's decisions, with stand-in CRIU executables (the seam is the binary the agent is configured with);
// the real CRIU's verdict on this host is whatever the node agent logs at start (and the e2e tests read).
const dir = mkdtempSync(join(tmpdir(), "warren-criu-probe-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function fakeCriu(name: string, script: string): string {
  const path = join(dir, name, "criu");
  rmSync(join(dir, name), { recursive: true, force: true });
  mkdirSync(join(dir, name));
  writeFileSync(path, `#!/bin/sh\n${script}\n`);
  chmodSync(path, 0o755);
  return path;
}

describe("CRIU probe", () => {
  it("calls a CRIU whose dump hangs unusable within the deadline, and caches the verdict for this boot", async () => {
    const calls = join(dir, "hangs.calls");
    const criu = fakeCriu("hangs", `echo "$1" >> ${calls}; if [ "$1" = dump ]; then exec sleep 60; fi`);
    const verdict = await probeCriu(criu);
    expect(verdict.usable).toBe(false);
    expect(verdict.reason).toMatch(/did not finish within 5000 ms/);
    expect(readFileSync(calls, "utf8")).toBe("dump\n");
    const cached = JSON.parse(readFileSync(criuProbeFile(criu), "utf8"));
    expect(cached).toMatchObject({
      usable: false,
      bootId: readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim(),
    });
    // The second probe on this boot reads the verdict instead of running CRIU again.
    expect(await probeCriu(criu)).toEqual(verdict);
    expect(readFileSync(calls, "utf8")).toBe("dump\n");
  }, 20_000);

  it("reports a failing dump with CRIU's error lines", async () => {
    const criu = fakeCriu(
      "fails",
      'while [ $# -gt 0 ]; do [ "$1" = -D ] && D=$2; shift; done; echo "(0.1) Error (criu/cr-dump.c:1): nope" > "$D/dump.log"; exit 1',
    );
    const verdict = await probeCriu(criu);
    expect(verdict).toMatchObject({ usable: false });
    expect(verdict.reason).toContain("criu dump of a sleep failed (1): (0.1) Error (criu/cr-dump.c:1): nope");
  }, 20_000);

  it("calls CRIU usable when the dump ends the process and the restore brings one back", async () => {
    // dump: kill the target (as CRIU does); restore: start a process and write its pid.
    const criu = fakeCriu(
      "works",
      [
        'cmd=$1; shift; while [ $# -gt 0 ]; do case "$1" in -t) T=$2;; --pidfile) P=$2;; esac; shift; done',
        'if [ "$cmd" = dump ]; then kill -9 "$T"; exit 0; fi',
        'setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $! > "$P"; exit 0',
      ].join("\n"),
    );
    const verdict = await probeCriu(criu);
    expect(verdict).toMatchObject({ usable: true, reason: "dumped and restored a process" });
  }, 20_000);
});
