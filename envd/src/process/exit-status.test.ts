import { describe, expect, it } from "vitest";
import { processExit } from "./exit-status.js";

describe("processExit", () => {
  it("reports success as Go does, without an error", () => {
    expect(processExit(0, null)).toEqual({ exitCode: 0, exited: true, status: "exit status 0" });
  });

  it("reports a failing exit code as both status and error", () => {
    expect(processExit(3, null)).toEqual({
      exitCode: 3,
      exited: true,
      status: "exit status 3",
      error: "exit status 3",
    });
  });

  it("reports a signal death with exit code -1 and Go's signal names", () => {
    expect(processExit(null, "SIGKILL")).toEqual({
      exitCode: -1,
      exited: false,
      status: "signal: killed",
      error: "signal: killed",
    });
    expect(processExit(null, "SIGTERM").status).toBe("signal: terminated");
    expect(processExit(0, 2).status).toBe("signal: interrupt");
    expect(processExit(null, 40).status).toBe("signal: signal 40");
  });
});
