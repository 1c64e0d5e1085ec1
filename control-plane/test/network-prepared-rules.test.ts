import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { silentLogger } from "@warren/platform/log";
import { afterAll, describe, expect, it } from "vitest";
import { NetworkPool } from "../src/runtime/namespace/network.js";

// Needs root (network namespaces, host iptables chains of its own). Slots' namespaces are set up by envd's static
// launcher (`warren-exec --netns-setup`) where it is built, else by nsenter and a shell: both are checked.
const LAUNCHER = fileURLToPath(new URL("../../envd/dist/warren-exec", import.meta.url));

const rules = (marker: string) => `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT DROP [0:0]
-A OUTPUT -o lo -m comment --comment ${marker} -j ACCEPT
COMMIT
`;

function namespaceRules(netns: string): string {
  return execFileSync("ip", ["netns", "exec", netns, "iptables", "-w", "-S", "OUTPUT"], { encoding: "utf8" });
}

function iptables(...args: string[]): void {
  try {
    execFileSync("iptables", ["-w", ...args], { stdio: "ignore" });
  } catch {
    // absent already
  }
}

describe.each([
  { instance: "nr", cidr: "10.249.0.0/24", launcher: undefined, setUpBy: "nsenter and a shell" },
  { instance: "nrl", cidr: "10.249.1.0/24", launcher: LAUNCHER, setUpBy: "warren-exec --netns-setup" },
])("network slots set up by $setUpBy", ({ instance: INSTANCE, cidr, launcher }) => {
  const pool = new NetworkPool({
    instance: INSTANCE,
    cidr,
    poolSize: 0,
    log: silentLogger,
    uplinkForwarding: false,
    ...(launcher ? { launcher } : {}),
  });

  afterAll(async () => {
    await pool.close();
    // Whatever a failed run left of this instance's slots (namespaces, veths, rules).
    await pool.sweep(new Set());
    const tag = INSTANCE.toUpperCase();
    iptables("-D", "INPUT", "-j", `WARREN-${tag}-IN`);
    iptables("-D", "FORWARD", "-j", `WARREN-${tag}-FWD`);
    iptables("-t", "nat", "-D", "POSTROUTING", "-j", `WARREN-${tag}-NAT`);
    for (const chain of [`WARREN-${tag}-IN`, `WARREN-${tag}-FWD`]) {
      iptables("-F", chain);
      iptables("-X", chain);
    }
    iptables("-t", "nat", "-F", `WARREN-${tag}-NAT`);
    iptables("-t", "nat", "-X", `WARREN-${tag}-NAT`);
  });

  it("have the namespace's and the veth's settings", async () => {
    // The launcher is what `npm run build` makes: this case must not quietly fall back to nsenter.
    if (launcher) expect(existsSync(launcher)).toBe(true);
    await pool.start();
    const slot = await pool.acquire();
    try {
      const inside = execFileSync(
        "ip",
        [
          "netns",
          "exec",
          slot.netns,
          "sysctl",
          "-n",
          "net.ipv6.conf.all.disable_ipv6",
          "net.ipv6.conf.default.disable_ipv6",
          "net.ipv6.conf.eth0.disable_ipv6",
          "net.ipv4.ip_unprivileged_port_start",
          "net.ipv4.ping_group_range",
          "net.ipv4.ip_nonlocal_bind",
        ],
        { encoding: "utf8" },
      );
      expect(inside.trim().split("\n")).toEqual(["1", "1", "1", "0", "0\t2147483647", "1"]);
      const host = execFileSync(
        "sysctl",
        ["-n", `net.ipv6.conf.${slot.hostVeth}.disable_ipv6`, `net.ipv4.conf.${slot.hostVeth}.forwarding`],
        { encoding: "utf8" },
      );
      expect(host.trim().split("\n")).toEqual(["1", "1"]);
      expect(execFileSync("ip", ["-n", slot.netns, "route"], { encoding: "utf8" })).toContain(
        `default via ${slot.hostAddr} dev eth0`,
      );
    } finally {
      await pool.release(slot);
    }
  });

  it("start with the prepared firewall, skip applying the same rules again, and apply any other rules", async () => {
    await pool.start();
    // Before any preparation a slot is closed: nothing but loopback and replies leaves.
    const closed = await pool.acquire();
    expect(namespaceRules(closed.netns)).toMatch(/-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset/);
    await pool.release(closed);

    pool.prepareRules((slot) => rules(`prepared-${slot.index}`));
    const slot = await pool.acquire();
    expect(namespaceRules(slot.netns)).toContain(`prepared-${slot.index}`);

    // Something outside Warren changes the namespace's rules: applying the rules the slot was made with is skipped
    // (no nsenter, no iptables-restore on the create path), so the change is still there.
    execFileSync("ip", [
      "netns",
      "exec",
      slot.netns,
      "iptables",
      "-w",
      "-A",
      "OUTPUT",
      "-m",
      "comment",
      "--comment",
      "outside",
      "-j",
      "DROP",
    ]);
    await pool.applySandboxFirewall(slot, rules(`prepared-${slot.index}`));
    expect(namespaceRules(slot.netns)).toContain("outside");

    // Other rules (a create asking for another policy) replace the namespace's rules whole.
    await pool.applySandboxFirewall(slot, rules("other"));
    const other = namespaceRules(slot.netns);
    expect(other).toContain("other");
    expect(other).not.toContain("outside");
    expect(other).not.toContain("prepared-");
    // ... and going back to the prepared rules applies them again.
    await pool.applySandboxFirewall(slot, rules(`prepared-${slot.index}`));
    expect(namespaceRules(slot.netns)).toContain(`prepared-${slot.index}`);
    expect(namespaceRules(slot.netns)).not.toContain("other");

    // Its host rules were added with it; a release deletes them by their spec and removes veth and namespace.
    expect((await pool.ownRules()).filter((line) => line.includes(pool.ruleTag(slot.index)))).toHaveLength(9);
    await pool.release(slot);
    expect(execFileSync("ip", ["netns", "list"], { encoding: "utf8" })).not.toContain(slot.netns);
    expect(execFileSync("ip", ["-o", "link"], { encoding: "utf8" })).not.toContain(slot.hostVeth);
    expect(await pool.ownRules()).toEqual([]);
  });
});
