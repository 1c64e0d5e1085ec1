import { describe, expect, it, vi } from "vitest";
import { type BootTestResult, decideDriver, type HostFacts, ProbeError } from "./probe.js";

const REAL_KVM: HostFacts = {
  kvmDevice: true,
  kvmModules: ["kvm", "kvm_intel"],
  qemu: true,
  guestKernel: true,
  otherVmms: [],
};
const PVM: HostFacts = { ...REAL_KVM, kvmModules: ["kvm", "kvm_pvm"] };
const booted = async (): Promise<BootTestResult> => ({ booted: true, detail: "guest userspace after 420 ms" });
const hung = async (): Promise<BootTestResult> => ({ booted: false, detail: "no guest userspace within 10000 ms" });

describe("capability probe decision", () => {
  it("chooses microvm (KVM) only when a guest really boots under KVM", async () => {
    const result = await decideDriver("auto", REAL_KVM, booted);
    expect(result.driver).toBe("microvm");
    expect(result.reasons.join("\n")).toMatch(/KVM boot test: guest userspace after 420 ms/);
  });

  it("a /dev/kvm whose boot test fails gives namespace, with the test's outcome as the reason", async () => {
    const result = await decideDriver("auto", REAL_KVM, hung);
    expect(result.driver).toBe("namespace");
    expect(result.reasons.join("\n")).toMatch(/no guest userspace within 10000 ms/);
  });

  it("a PVM-only /dev/kvm gives namespace without paying for a boot test, and says why", async () => {
    const bootTest = vi.fn(booted);
    const result = await decideDriver("auto", PVM, bootTest);
    expect(result.driver).toBe("namespace");
    expect(bootTest).not.toHaveBeenCalled();
    expect(result.reasons.join("\n")).toMatch(/kvm_pvm/);
  });

  it("no /dev/kvm, or no QEMU or guest kernel, gives namespace", async () => {
    const bootTest = vi.fn(booted);
    expect((await decideDriver("auto", { ...REAL_KVM, kvmDevice: false }, bootTest)).driver).toBe("namespace");
    const noQemu = await decideDriver("auto", { ...REAL_KVM, qemu: false }, bootTest);
    expect(noQemu.driver).toBe("namespace");
    expect(noQemu.reasons.join("\n")).toMatch(/qemu-system-x86_64/);
    expect(bootTest).not.toHaveBeenCalled();
  });

  it("software emulation (microvm-tcg) is chosen only when asked for, never by auto", async () => {
    const noKvm = { ...REAL_KVM, kvmDevice: false, kvmModules: [] };
    expect((await decideDriver("auto", noKvm, hung)).driver).toBe("namespace");
    const asked = await decideDriver("microvm-tcg", noKvm, hung);
    expect(asked.driver).toBe("microvm-tcg");
    expect(asked.reasons.join("\n")).toMatch(/WARREN_DRIVER=microvm-tcg/);
  });

  it("an explicit microvm or microvm-tcg that cannot be honoured is an error, not a silent fallback", async () => {
    await expect(decideDriver("microvm", PVM, hung)).rejects.toBeInstanceOf(ProbeError);
    await expect(decideDriver("microvm-tcg", { ...REAL_KVM, qemu: false }, booted)).rejects.toThrow(
      /qemu-system-x86_64/,
    );
  });

  it("namespace when configured, whatever the host has; other VMMs are reported", async () => {
    const bootTest = vi.fn(booted);
    const result = await decideDriver("namespace", { ...REAL_KVM, otherVmms: ["firecracker"] }, bootTest);
    expect(result.driver).toBe("namespace");
    expect(bootTest).not.toHaveBeenCalled();
    expect(result.reasons.join("\n")).toMatch(/firecracker/);
  });
});
