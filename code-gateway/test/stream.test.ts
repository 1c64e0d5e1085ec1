import { afterAll, beforeAll, expect, it } from "vitest";
import { startTestGateway, type TestGateway } from "./harness.js";

// The /execute wire format itself (E2B-PROTOCOL §5.2), read line by line without the SDK.
let gateway: TestGateway;
beforeAll(async () => {
  gateway = await startTestGateway({ env: { CODE_GATEWAY_KEEPALIVE_MS: "300" } });
}, 60_000);
afterAll(async () => {
  await gateway?.stop();
});

interface TimedLine {
  at: number;
  line: Record<string, unknown>;
}

async function execute(body: unknown): Promise<{ lines: TimedLine[]; raw: string; contentType: string | null }> {
  const started = performance.now();
  const res = await fetch(`${gateway.url}/execute`, { method: "POST", body: JSON.stringify(body) });
  expect(res.status).toBe(200);
  const lines: TimedLine[] = [];
  let raw = "";
  let pending = "";
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    const text = decoder.decode(chunk, { stream: true });
    raw += text;
    pending += text;
    let newline = pending.indexOf("\n");
    while (newline !== -1) {
      lines.push({ at: performance.now() - started, line: JSON.parse(pending.slice(0, newline)) });
      pending = pending.slice(newline + 1);
      newline = pending.indexOf("\n");
    }
  }
  return { lines, raw, contentType: res.headers.get("content-type") };
}

it("streams NDJSON lines as they are produced, with keepalives in silences and end_of_execution last", async () => {
  const { lines, raw } = await execute({ code: "import time\nprint('a', flush=True)\ntime.sleep(1.2)\nprint('b')" });
  expect(raw.endsWith("\n")).toBe(true);
  const types = lines.map((l) => l.line.type);
  expect(types[0]).toBe("number_of_executions");
  expect(types.at(-1)).toBe("end_of_execution");
  expect(types.filter((t) => t === "keepalive").length).toBeGreaterThanOrEqual(2);
  const a = lines.find((l) => l.line.text === "a\n");
  const end = lines.at(-1);
  expect(a && end && end.at - a.at).toBeGreaterThan(800);
  expect(a?.line).toMatchObject({ type: "stdout", timestamp: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) });
});

it("marks execute_result as the main result and display_data as not, and sends only the first error", async () => {
  const { lines } = await execute({
    code: "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\n7",
  });
  const results = lines.map((l) => l.line).filter((l) => l.type === "result");
  expect(results).toEqual([
    { type: "result", is_main_result: false, text: "<IPython.core.display.HTML object>", html: "<b>x</b>", extra: {} },
    { type: "result", is_main_result: true, text: "7", extra: {} },
  ]);
  const failed = await execute({ code: "raise ValueError('first')" });
  const errors = failed.lines.map((l) => l.line).filter((l) => l.type === "error");
  expect(errors).toHaveLength(1);
  expect(errors[0]).toMatchObject({ name: "ValueError", value: "first" });
  expect(String(errors[0]?.traceback)).toContain("ValueError");
});

it("runs a request with neither context nor language in the default python context", async () => {
  await execute({ code: "default_marker = 'py'" });
  const { lines } = await execute({ code: "default_marker", language: "python" });
  expect(lines.map((l) => l.line).find((l) => l.type === "result")?.text).toBe("py");
});

it("interrupts the kernel when the client aborts a raw request", async () => {
  const controller = new AbortController();
  const res = await fetch(`${gateway.url}/execute`, {
    method: "POST",
    body: JSON.stringify({ code: "import time; time.sleep(300)" }),
    signal: controller.signal,
  });
  expect(res.status).toBe(200);
  controller.abort();
  const started = performance.now();
  const { lines } = await execute({ code: "'after'" });
  expect(lines.map((l) => l.line).find((l) => l.type === "result")?.text).toBe("after");
  expect(performance.now() - started).toBeLessThan(10_000);
});
