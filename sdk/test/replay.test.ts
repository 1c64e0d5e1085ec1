import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type OutputLostError, type Sandbox, SandboxError, TimeoutError } from "../src/index.js";
import {
  type Relay,
  scratch,
  startEnvd,
  startHeaderTap,
  startRelay,
  type TestEnvd,
  until,
  warrenSandbox,
} from "./harness.js";

function seq(from: number, to: number): string {
  let out = "";
  for (let i = from; i <= to; i++) out += `${i}\n`;
  return out;
}

describe("reconnect with replay", () => {
  let envd: TestEnvd;
  let relay: Relay;
  let direct: Sandbox;
  let relayed: Sandbox;

  beforeAll(async () => {
    envd = await startEnvd({ accessToken: "replay-token" });
    relay = await startRelay(envd.port);
    direct = warrenSandbox(envd.url, { accessToken: "replay-token" });
    relayed = warrenSandbox(relay.url, { accessToken: "replay-token" });
  });
  afterAll(async () => {
    await relay?.close();
    await envd?.stop();
  });

  test("a stream cut mid-output resumes from the last byte seen: every byte arrives exactly once", async () => {
    const marker = `/tmp/${scratch("marker")}`;
    const chunks: string[] = [];
    const handle = await relayed.commands.run(
      `seq 1 2000; read x; seq 2001 20000; touch ${marker}; read y; seq 20001 21000`,
      {
        background: true,
        stdin: true,
        onStdout: (d) => void chunks.push(d),
      },
    );
    await until(() => handle.stdout.endsWith("2000\n"), "the first phase of output");
    // The network goes away; while it is away the command produces more output.
    relay.block();
    relay.cut();
    await direct.commands.sendStdin(handle.pid, "x\n");
    await until(() => direct.files.exists(marker), "the command to produce output while the client was away");
    relay.unblock();
    await direct.commands.sendStdin(handle.pid, "y\n");
    const result = await handle.wait();
    expect(result.stdout).toBe(seq(1, 21000));
    expect(chunks.join("")).toBe(seq(1, 21000));
    expect(handle.reconnects).toBeGreaterThanOrEqual(1);
    expect(handle.lostOutput).toEqual([]);
  });

  test("a command that ends while its stream is down still delivers its tail and exit code", async () => {
    const marker = `/tmp/${scratch("end")}`;
    const handle = await relayed.commands.run(`echo start; read x; seq 1 500; touch ${marker}; exit 7`, {
      background: true,
      stdin: true,
    });
    await until(() => handle.stdout === "start\n", "the first line");
    relay.block();
    relay.cut();
    await direct.commands.sendStdin(handle.pid, "x\n");
    await until(() => direct.files.exists(marker), "the command to finish while the client was away");
    relay.unblock();
    const error = await handle.wait().catch((e: unknown) => e);
    expect((error as { exitCode: number }).exitCode).toBe(7);
    expect((error as { stdout: string }).stdout).toBe(`start\n${seq(1, 500)}`);
  });

  test("a silent (half-open) stream is detected by the idle watchdog and resumed", async () => {
    const own = await startRelay(envd.port);
    try {
      const sandbox = warrenSandbox(own.url, { accessToken: "replay-token" });
      const handle = await sandbox.commands.run("read x; echo after-$x", {
        background: true,
        stdin: true,
        keepaliveIntervalS: 1,
        idleTimeoutMs: 1_500,
      });
      own.stall();
      await direct.commands.sendStdin(handle.pid, "stall\n");
      const result = await handle.wait();
      expect(result.stdout).toBe("after-stall\n");
      expect(handle.reconnects).toBeGreaterThanOrEqual(1);
    } finally {
      await own.close();
    }
  });

  test("multi-byte characters split across a drop are decoded intact", async () => {
    const marker = `/tmp/${scratch("utf8")}`;
    const handle = await relayed.commands.run(
      `printf 'héllo-'; read x; for i in $(seq 1 2000); do printf 'é€𝄞'; done; touch ${marker}`,
      { background: true, stdin: true },
    );
    await until(() => handle.stdout === "héllo-", "the first characters");
    relay.block();
    relay.cut();
    await direct.commands.sendStdin(handle.pid, "x\n");
    await until(() => direct.files.exists(marker), "the multi-byte output");
    relay.unblock();
    const result = await handle.wait();
    expect(result.stdout).toBe(`héllo-${"é€𝄞".repeat(2000)}`);
  });

  test("reconnect: false keeps E2B's behaviour: a dropped stream fails the handle", async () => {
    const own = await startRelay(envd.port);
    try {
      const sandbox = warrenSandbox(own.url, { accessToken: "replay-token" });
      const handle = await sandbox.commands.run("sleep 600", { background: true, reconnect: false });
      own.cut();
      const error = await handle.wait().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SandboxError);
      expect(handle.reconnects).toBe(0);
      await direct.commands.kill(handle.pid);
    } finally {
      await own.close();
    }
  });

  test("a stream that cannot be re-established within reconnectWindowMs fails with TimeoutError", async () => {
    const own = await startRelay(envd.port);
    try {
      const sandbox = warrenSandbox(own.url, { accessToken: "replay-token" });
      const handle = await sandbox.commands.run("sleep 600", { background: true, reconnectWindowMs: 500 });
      own.block();
      own.cut();
      const error = await handle.wait().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(TimeoutError);
      expect((error as Error).message).toContain("could not be re-established within 500 ms");
      await direct.commands.kill(handle.pid);
    } finally {
      await own.close();
    }
  });

  test("a terminal (PTY) whose stream drops resumes without losing what it printed meanwhile", async () => {
    const own = await startRelay(envd.port);
    try {
      const sandbox = warrenSandbox(own.url, { accessToken: "replay-token" });
      let screen = "";
      const decoder = new TextDecoder();
      const terminal = await sandbox.pty.create({
        cols: 80,
        rows: 24,
        onData: (d) => {
          screen += decoder.decode(d, { stream: true });
        },
      });
      await direct.pty.sendInput(terminal.pid, new TextEncoder().encode("echo one-$((1+1))\n"));
      await until(() => screen.includes("one-2"), "output before the drop");
      own.block();
      own.cut();
      await direct.pty.sendInput(terminal.pid, new TextEncoder().encode("echo two-$((2+2))\n"));
      own.unblock();
      await until(() => screen.includes("two-4"), "output printed while the stream was down");
      expect(terminal.reconnects).toBeGreaterThanOrEqual(1);
      expect(screen.split("one-2").length).toBe(2); // the first output is not replayed twice
      await direct.pty.kill(terminal.pid);
    } finally {
      await own.close();
    }
  });

  test("connect(pid, { replayFrom: 0 }) replays output produced before anyone attached", async () => {
    const marker = `/tmp/${scratch("early")}`;
    const handle = await direct.commands.run(`seq 1 300; touch ${marker}; read x; echo late`, {
      background: true,
      stdin: true,
    });
    await until(() => direct.files.exists(marker), "the early output");
    await handle.disconnect();
    const attached = await direct.commands.connect(handle.pid, { replayFrom: 0 });
    await direct.commands.sendStdin(handle.pid, "x\n");
    const result = await attached.wait();
    expect(result.stdout).toBe(`${seq(1, 300)}late\n`);
  });

  test("Start carries Connect-Timeout-Ms only when the caller gives timeoutMs (no hidden deadline)", async () => {
    const tap = await startHeaderTap(envd.port);
    try {
      const tapped = warrenSandbox(tap.url, { accessToken: "replay-token" });
      await tapped.commands.run("true");
      await tapped.commands.run("true", { timeoutMs: 30_000 });
      const starts = tap.seen.filter((s) => s.path === "/process.Process/Start");
      expect(starts).toHaveLength(2);
      expect(starts[0]?.headers["connect-timeout-ms"]).toBeUndefined();
      expect(Number(starts[1]?.headers["connect-timeout-ms"])).toBeGreaterThan(29_000);
    } finally {
      await tap.close();
    }
  });
});

describe("data loss is detected and surfaced", () => {
  let envd: TestEnvd;
  let relay: Relay;

  beforeAll(async () => {
    // envd keeps only 4 KiB of each process's output.
    envd = await startEnvd({ env: { ENVD_OUTPUT_BUFFER_BYTES: "4096" } });
    relay = await startRelay(envd.port);
  });
  afterAll(async () => {
    await relay?.close();
    await envd?.stop();
  });

  test("output the sandbox no longer holds is reported as an OutputLostError with the exact byte range", async () => {
    const direct = warrenSandbox(envd.url);
    const relayed = warrenSandbox(relay.url);
    const marker = `/tmp/${scratch("loss")}`;
    const reported: OutputLostError[] = [];
    const handle = await relayed.commands.run(`echo first; read x; seq 1 20000; touch ${marker}; read y; echo last`, {
      background: true,
      stdin: true,
      onOutputLost: (lost) => void reported.push(lost),
    });
    await until(() => handle.stdout === "first\n", "the first line");
    relay.block();
    relay.cut();
    await direct.commands.sendStdin(handle.pid, "x\n");
    await until(() => direct.files.exists(marker), "more output than envd holds");
    relay.unblock();
    await direct.commands.sendStdin(handle.pid, "y\n");
    const result = await handle.wait();

    const full = `first\n${seq(1, 20000)}last\n`;
    expect(reported).toHaveLength(1);
    const lost = reported[0] as OutputLostError;
    expect(lost.fromOffset).toBe("first\n".length);
    const lostBytes = (lost.toOffset as number) - lost.fromOffset;
    expect(lostBytes).toBeGreaterThan(0);
    // What arrived is exactly the full output minus the reported range: nothing else missing, nothing doubled.
    expect(result.stdout).toBe(full.slice(0, lost.fromOffset) + full.slice(lost.toOffset as number));
    expect(handle.lostOutput).toEqual(reported);
  });
});
