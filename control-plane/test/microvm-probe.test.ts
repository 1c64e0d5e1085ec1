import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadNodeAgentConfig } from "../src/node-agent/config.js";
import { createLogger } from "../src/node-agent/log.js";
import { ensureKernel } from "../src/runtime/microvm/guest-image.js";
import { decideDriver, hostFacts, kvmBootTest, ProbeError } from "../src/runtime/microvm/probe.js";
import { selectRuntime } from "../src/runtime/microvm/select.js";

const LINUX = "/var/lib/warren/microvm/linux";
const facts = hostFacts(LINUX);
/** This machine class: /dev/kvm from the nested PVM module (RUNTIME-NOTES §3.2), or no /dev/kvm at all. */
const noRealKvm = !facts.kvmDevice || !facts.kvmModules.some((m) => m === "kvm_intel" || m === "kvm_amd");
const cacheDir = mkdtempSync(join(tmpdir(), "warren-probe-"));

afterAll(() => rmSync(cacheDir, { recursive: true, force: true }));

describe.runIf(noRealKvm)("capability probe on a host without real KVM (CI: PVM)", () => {
  it("the node agent's default (auto) chooses namespace and logs its reasoning", async () => {
    const lines: string[] = [];
    const log = createLogger("node-agent", { level: "info", write: (line) => lines.push(line) });
    const config = loadNodeAgentConfig({
      WARREN_NODE_ID: "probe-test",
      WARREN_MICROVM_DIR: cacheDir,
      WARREN_MICROVM_KERNEL: LINUX,
    });
    expect(config.driver).toBe("auto");
    const selection = await selectRuntime(config, log);
    expect(selection.probe.driver).toBe("namespace");
    expect(selection.microvm).toBeUndefined();
    const logged = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    const decision = logged.find((l) => l.msg === "runtime driver chosen by the capability probe");
    expect(decision).toMatchObject({ requested: "auto", driver: "namespace" });
    const reasons = (decision?.reasons as string[]).join("\n");
    if (!facts.kvmDevice) expect(reasons).toMatch(/no usable \/dev\/kvm/);
    if (facts.kvmModules.includes("kvm_pvm")) expect(reasons).toMatch(/kvm_pvm/);
    expect(reasons).toMatch(/choosing namespace/);
  });

  it.runIf(facts.kvmDevice && facts.qemu && facts.guestKernel)(
    "WARREN_DRIVER=microvm forces the real KVM boot test, which fails here within its deadline",
    async () => {
      const kernel = await ensureKernel({
        dir: "/var/lib/warren/microvm",
        linuxDir: LINUX,
        busybox: "/bin/busybox",
        nodeBinary: process.execPath,
        envdRoot: join(import.meta.dirname, "..", ".."),
        uidBase: 100000,
      });
      const started = Date.now();
      const error = await decideDriver("microvm", facts, () => kvmBootTest(kernel, cacheDir, 10_000)).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ProbeError);
      expect((error as ProbeError).reasons.join("\n")).toMatch(/KVM boot test: (qemu exited|no guest userspace)/);
      expect(Date.now() - started).toBeLessThan(20_000);
    },
    30_000,
  );
});
