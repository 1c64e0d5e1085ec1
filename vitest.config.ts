import { configDefaults, defineConfig } from "vitest/config";

/**
 * The microvm driver's files: their guests run under TCG here (no real KVM), a full core each for minutes. They run
 * as a group of their own once every other file has finished, so that on this 2-core machine neither they nor the
 * namespace driver's whole-cluster files (CRIU dumps and restores, code sandboxes) are starved by the other.
 */
const TCG_FILES = ["control-plane/test/microvm-*.test.ts", "control-plane/test/mixed-drivers.test.ts"];
const TEST_FILES = ["*/src/**/*.test.ts", "*/test/**/*.test.ts"];

export default defineConfig({
  test: {
    // The shipped templates, made by the template builder through a one-node cluster when this host lacks them.
    globalSetup: ["e2e/src/prebuild-shipped-templates.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Each test file starts its own envd; two at a time keep this 2-core machine responsive.
    maxWorkers: 2,
    // Node agents started by tests (and the clusters they launch) leave the host's uplink forwarding alone, and
    // their sandboxes' DNS goes nowhere (the discard port on loopback) unless a test sets its own upstream: no
    // query leaves this machine. Shipped templates are not shared through the registries test clusters start (their
    // agents share this host's template cache; control-plane/test/shipped-templates.test.ts turns sharing on).
    env: { WARREN_UPLINK_FORWARDING: "0", WARREN_DNS_UPSTREAM: "127.0.0.1:9", WARREN_SHARE_SHIPPED_TEMPLATES: "off" },
    projects: [
      {
        extends: true,
        test: {
          name: "warren",
          include: TEST_FILES,
          exclude: [...configDefaults.exclude, "**/dist/**", ...TCG_FILES],
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: {
          name: "microvm",
          include: TCG_FILES,
          exclude: [...configDefaults.exclude, "**/dist/**"],
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
