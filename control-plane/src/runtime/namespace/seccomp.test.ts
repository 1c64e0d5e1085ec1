import { describe, expect, it } from "vitest";
import { sandboxSpec } from "./oci-spec.js";
import { sandboxSeccomp } from "./seccomp.js";

describe("sandbox seccomp filter and OCI spec", () => {
  it("denies mount, namespaces, modules, kexec, reboot, swap, bpf, perf, keyrings and clock setting", () => {
    const profile = sandboxSeccomp();
    expect(profile.defaultAction).toBe("SCMP_ACT_ALLOW");
    const denied = profile.syscalls.filter((rule) => !rule.args).flatMap((rule) => rule.names);
    for (const name of [
      "mount",
      "unshare",
      "setns",
      "init_module",
      "finit_module",
      "kexec_load",
      "reboot",
      "swapon",
      "bpf",
      "perf_event_open",
      "keyctl",
      "add_key",
      "clock_settime",
      "settimeofday",
      "open_by_handle_at",
    ]) {
      expect(denied, name).toContain(name);
    }
    // No memory protection keys (a CRIU restore would lose them): ENOSPC, as on a CPU without PKU.
    expect(profile.syscalls.find((rule) => rule.names.includes("pkey_alloc"))).toMatchObject({
      action: "SCMP_ACT_ERRNO",
      errnoRet: 28,
    });
    const cloneRules = profile.syscalls.filter((rule) => rule.names.includes("clone"));
    expect(cloneRules.length).toBe(8);
    expect(cloneRules.some((rule) => rule.args?.[0]?.value === 0x10000000)).toBe(true); // CLONE_NEWUSER
  });

  it("maps sandbox uids 0..65535 to the unprivileged host range and keeps no-new-privileges for setuid-free templates", () => {
    const input = {
      rootfs: "/r",
      netnsPath: "/run/netns/x",
      uidBase: 100000,
      idCount: 65536,
      args: ["/bin/true"],
      env: [],
      hostBinds: [{ source: "/usr/bin/node", destination: "/usr/local/bin/node" }],
    };
    const withSudo = sandboxSpec({ ...input, allowSetuid: true }) as {
      process: { noNewPrivileges: boolean; capabilities: { bounding: string[] } };
      linux: { uidMappings: unknown[]; namespaces: { type: string; path?: string }[] };
      mounts: { destination: string; options?: string[] }[];
    };
    expect(withSudo.process.noNewPrivileges).toBe(false);
    expect(withSudo.linux.uidMappings).toEqual([{ containerID: 0, hostID: 100000, size: 65536 }]);
    expect(withSudo.linux.namespaces.map((ns) => ns.type).sort()).toEqual([
      "cgroup",
      "ipc",
      "mount",
      "network",
      "pid",
      "user",
      "uts",
    ]);
    expect(withSudo.process.capabilities.bounding).not.toContain("CAP_SYS_ADMIN");
    expect(withSudo.process.capabilities.bounding).not.toContain("CAP_NET_ADMIN");
    expect(withSudo.mounts.find((m) => m.destination === "/usr/local/bin/node")?.options).toContain("ro");
    const strict = sandboxSpec({ ...input, allowSetuid: false }) as { process: { noNewPrivileges: boolean } };
    expect(strict.process.noNewPrivileges).toBe(true);
  });
});
