import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["*/src/**/*.test.ts", "*/test/**/*.test.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Each test file starts its own envd; two at a time keep this 2-core machine responsive.
    maxWorkers: 2,
    // Node agents started by tests (and the clusters they launch) leave the host's uplink forwarding alone, and
    // their sandboxes' DNS goes nowhere (the discard port on loopback) unless a test sets its own upstream: no
    // query leaves this machine.
    env: { WARREN_UPLINK_FORWARDING: "0", WARREN_DNS_UPSTREAM: "127.0.0.1:9" },
  },
});
