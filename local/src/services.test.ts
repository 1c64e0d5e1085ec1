import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { describe, expect, it } from "vitest";
import { freePort } from "./services.js";

describe("freePort", () => {
  it("picks ports below the kernel's ephemeral range that can be listened on, and not always the same one", async () => {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    const ports = await Promise.all(Array.from({ length: 20 }, () => freePort()));
    for (const port of ports) {
      expect(port).toBeGreaterThanOrEqual(20_000);
      expect(port).toBeLessThan(low);
    }
    expect(new Set(ports).size).toBeGreaterThan(15);
    const port = ports[0] as number;
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
});
