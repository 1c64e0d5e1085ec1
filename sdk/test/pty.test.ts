import { afterAll, beforeAll, describe, expect, test } from "vitest";
import type { Sandbox } from "../src/index.js";
import { startEnvd, type TestEnvd, until, warrenSandbox } from "./harness.js";

let envd: TestEnvd;
let sandbox: Sandbox;
const encode = (s: string) => new TextEncoder().encode(s);

beforeAll(async () => {
  envd = await startEnvd();
  sandbox = warrenSandbox(envd.url);
});
afterAll(async () => {
  await envd?.stop();
});

function collector() {
  let text = "";
  const decoder = new TextDecoder();
  return {
    onData: (d: Uint8Array) => {
      text += decoder.decode(d, { stream: true });
    },
    text: () => text,
  };
}

describe("pty", () => {
  test("create runs an interactive shell with the given envs; sendInput types into it; exit ends it", async () => {
    const out = collector();
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: out.onData, envs: { ABC: "pty-env" } });
    await sandbox.pty.sendInput(terminal.pid, encode("echo value=$ABC\n"));
    await until(() => out.text().includes("value=pty-env"), "the echoed value");
    await sandbox.pty.sendInput(terminal.pid, encode("exit\n"));
    const result = await terminal.wait();
    expect(result.exitCode).toBe(0);
  });

  test("resize changes the terminal's columns", async () => {
    const out = collector();
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: out.onData });
    await sandbox.pty.sendInput(terminal.pid, encode("echo cols=$(tput cols)\n"));
    await until(() => out.text().includes("cols=80"), "80 columns");
    await sandbox.pty.resize(terminal.pid, { cols: 100, rows: 30 });
    await sandbox.pty.sendInput(terminal.pid, encode("echo cols=$(tput cols)\n"));
    await until(() => out.text().includes("cols=100"), "100 columns");
    expect(await sandbox.pty.kill(terminal.pid)).toBe(true);
  });

  test("connect re-attaches with scrollback: what the terminal printed before is replayed first", async () => {
    const first = collector();
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: first.onData });
    await sandbox.pty.sendInput(terminal.pid, encode("echo before-$((40+2))\n"));
    await until(() => first.text().includes("before-42"), "output before detaching");
    await terminal.disconnect();
    await sandbox.pty.sendInput(terminal.pid, encode("echo while-$((50+5))\n"));

    const second = collector();
    const attached = await sandbox.pty.connect(terminal.pid, { onData: second.onData });
    await until(() => second.text().includes("while-55"), "output produced while detached");
    expect(second.text()).toContain("before-42");
    await sandbox.pty.sendInput(terminal.pid, encode("echo after-$((60+6))\n"));
    await until(() => second.text().includes("after-66"), "live output after re-attaching");
    // Scrollback is replayed once: the first command's output appears once (plus its echo of the input line).
    expect(second.text().split("before-42").length - 1).toBe(first.text().split("before-42").length - 1);
    expect(attached.pid).toBe(terminal.pid);
    await sandbox.pty.kill(terminal.pid);
  });

  test("connect with scrollback: false gives live output only (E2B's behaviour)", async () => {
    const first = collector();
    const terminal = await sandbox.pty.create({ cols: 80, rows: 24, onData: first.onData });
    await sandbox.pty.sendInput(terminal.pid, encode("echo old-$((1+1))\n"));
    await until(() => first.text().includes("old-2"), "old output");
    await terminal.disconnect();
    const second = collector();
    await sandbox.pty.connect(terminal.pid, { onData: second.onData, scrollback: false });
    await sandbox.pty.sendInput(terminal.pid, encode("echo new-$((2+1))\n"));
    await until(() => second.text().includes("new-3"), "new output");
    expect(second.text()).not.toContain("old-2");
    await sandbox.pty.kill(terminal.pid);
  });

  test("killing an unknown terminal returns false", async () => {
    expect(await sandbox.pty.kill(999_999)).toBe(false);
  });
});
