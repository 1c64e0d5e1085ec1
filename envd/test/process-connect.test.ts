// envd's process service through a plain Connect client: the parts of the protocol the e2b
// SDK never exercises (StreamInput, tags, keepalive timing) and Warren's output replay.

import { randomBytes } from "node:crypto";
import { existsSync, readFileSync, rmSync } from "node:fs";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  type ConnectResponse,
  Process,
  Signal,
  type StartRequestSchema,
  type StartResponse,
  type StreamInputRequestSchema,
} from "@warren/proto/process/process_pb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestEnvd, type TestEnvd } from "./harness.js";

const BUFFER_BYTES = 4096;

let envd: TestEnvd;
let client: Client<typeof Process>;

beforeAll(async () => {
  envd = await startTestEnvd({
    env: { ENVD_OUTPUT_BUFFER_BYTES: String(BUFFER_BYTES), ENVD_FINISHED_RETENTION_MS: "60000" },
  });
  client = connectClient(envd);
});

afterAll(async () => {
  await envd?.stop();
  for (const marker of markers) rmSync(marker, { force: true });
});

// Files that test processes touch to say how far they got; removed after the file.
const markers: string[] = [];
function markerPath(name: string): string {
  const path = `/tmp/warren-test-${name}-${randomBytes(4).toString("hex")}`;
  markers.push(path);
  return path;
}

function connectClient(target: TestEnvd): Client<typeof Process> {
  return createClient(
    Process,
    createConnectTransport({ baseUrl: target.url, httpVersion: "1.1", useBinaryFormat: false }),
  );
}

type Events = AsyncIterable<StartResponse | ConnectResponse>;
type StartInit = MessageInitShape<typeof StartRequestSchema>;

interface Collected {
  pid: number;
  output: string;
  keepalives: number;
  end?: { exitCode: number; exited: boolean; status: string; error?: string };
}

/** Reads a whole process stream: pid, stdout+stderr+pty text, keepalive count and end event. */
async function collect(events: Events): Promise<Collected> {
  const result: Collected = { pid: 0, output: "", keepalives: 0 };
  for await (const { event } of events) {
    const e = event?.event;
    if (e?.case === "start") result.pid = e.value.pid;
    else if (e?.case === "data") result.output += Buffer.from(e.value.output.value ?? []).toString();
    else if (e?.case === "keepalive") result.keepalives++;
    else if (e?.case === "end") {
      const { exitCode, exited, status, error } = e.value;
      result.end = { exitCode, exited, status, ...(error === undefined ? {} : { error }) };
    }
  }
  return result;
}

/** Starts a stream and reads up to its start event; the rest stays readable from `events`. */
async function begin(events: Events): Promise<{ pid: number; events: AsyncIterator<StartResponse | ConnectResponse> }> {
  const iterator = events[Symbol.asyncIterator]();
  const first = await iterator.next();
  const event = first.value?.event?.event;
  if (event?.case !== "start") throw new Error(`expected a start event, got ${JSON.stringify(first.value)}`);
  return { pid: event.value.pid, events: iterator };
}

/** The first event of a stream (enough to see an error raised before the start event). */
function first(events: Events): Promise<IteratorResult<StartResponse | ConnectResponse>> {
  return events[Symbol.asyncIterator]().next();
}

function rest(iterator: AsyncIterator<StartResponse | ConnectResponse>): Events {
  return { [Symbol.asyncIterator]: () => iterator };
}

function bash(script: string, extra: { stdin?: boolean; tag?: string } = {}): StartInit {
  return { process: { cmd: "/bin/bash", args: ["-c", script] }, stdin: false, ...extra };
}

/** Call options that record a stream's Warren-Output-Offset response header. */
function recordOffset(): { onHeader: (headers: Headers) => void; offset: () => string | null } {
  let value: string | null = null;
  return {
    onHeader: (headers) => {
      value = headers.get("Warren-Output-Offset");
    },
    offset: () => value,
  };
}

const pidSelector = (pid: number) => ({ selector: { case: "pid" as const, value: pid } });
const tagSelector = (tag: string) => ({ selector: { case: "tag" as const, value: tag } });
const bytes = (text: string) => new TextEncoder().encode(text);

async function expectCode(promise: Promise<unknown>, code: Code, message?: string): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error, `expected ${Code[code]}`).toBeInstanceOf(ConnectError);
  expect(Code[(error as ConnectError).code]).toBe(Code[code]);
  if (message) expect((error as ConnectError).rawMessage).toContain(message);
}

/** True while `pid` exists and is not a zombie (read from /proc on this host). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

async function waitUntil(condition: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

describe("input", () => {
  it("StreamInput writes its data events in order to the process named by its start event", async () => {
    const stream = await begin(client.start(bash("cat", { stdin: true })));
    async function* input(): AsyncGenerator<MessageInitShape<typeof StreamInputRequestSchema>> {
      yield { event: { case: "start", value: { process: pidSelector(stream.pid) } } };
      yield { event: { case: "data", value: { input: { input: { case: "stdin", value: bytes("first ") } } } } };
      yield { event: { case: "keepalive", value: {} } };
      yield { event: { case: "data", value: { input: { input: { case: "stdin", value: bytes("second\n") } } } } };
    }
    await client.streamInput(input());
    await client.closeStdin({ process: pidSelector(stream.pid) });
    const result = await collect(rest(stream.events));
    expect(result.output).toBe("first second\n");
    expect(result.end).toMatchObject({ exitCode: 0, exited: true, status: "exit status 0" });
  });

  it("StreamInput that does not start with a start event is invalid_argument", async () => {
    async function* input(): AsyncGenerator<MessageInitShape<typeof StreamInputRequestSchema>> {
      yield { event: { case: "data", value: { input: { input: { case: "stdin", value: bytes("x") } } } } };
    }
    await expectCode(client.streamInput(input()), Code.InvalidArgument, "start event");
  });

  it("opens a stdin pipe when the request does not mention stdin, and gives /dev/null when stdin is false", async () => {
    const piped = await begin(
      client.start({ process: { cmd: "/bin/bash", args: ["-c", "cat; echo eof-seen; sleep 30"] } }, { timeoutMs: 0 }),
    );
    await client.sendInput({
      process: pidSelector(piped.pid),
      input: { input: { case: "stdin", value: bytes("piped\n") } },
    });
    await client.closeStdin({ process: pidSelector(piped.pid) });
    let output = "";
    while (!output.includes("eof-seen")) {
      const next = await piped.events.next();
      output += Buffer.from(next.value?.event?.event.value?.output?.value ?? []).toString();
    }
    expect(output).toBe("piped\neof-seen\n");
    // Closing again is harmless.
    await client.closeStdin({ process: pidSelector(piped.pid) });
    await client.sendSignal({ process: pidSelector(piped.pid), signal: Signal.SIGKILL });

    const devNull = await collect(client.start({ process: { cmd: "cat" }, stdin: false }));
    expect(devNull).toMatchObject({ output: "", end: { exitCode: 0 } });
  });
});

describe("selection", () => {
  it("selects a process by tag in Connect, SendInput and List, and refuses a tag that a live process has", async () => {
    const tag = `job-${randomBytes(3).toString("hex")}`;
    const started = await begin(client.start(bash('read x; echo "tag-$x"', { stdin: true, tag })));
    await expectCode(first(client.start(bash("true", { tag }))), Code.AlreadyExists, `'${tag}'`);

    const listed = (await client.list({})).processes.find((p) => p.pid === started.pid);
    expect(listed).toMatchObject({ tag, config: { cmd: "/bin/bash", args: ["-c", 'read x; echo "tag-$x"'] } });

    const connected = await begin(client.connect({ process: tagSelector(tag) }));
    expect(connected.pid).toBe(started.pid);
    await client.sendInput({ process: tagSelector(tag), input: { input: { case: "stdin", value: bytes("7\n") } } });
    expect((await collect(rest(connected.events))).output).toBe("tag-7\n");
    expect((await collect(rest(started.events))).output).toBe("tag-7\n");

    // Once the first holder has exited, the tag is free again.
    const reused = await collect(client.start(bash("echo again", { tag })));
    expect(reused.output).toBe("again\n");
    expect((await client.list({})).processes.map((p) => p.pid)).not.toContain(started.pid);
  });

  it("fans the same output out to several Connect subscribers", async () => {
    const started = await begin(client.start(bash('read x; echo "fan-$x"', { stdin: true })));
    const one = await begin(client.connect({ process: pidSelector(started.pid) }));
    const two = await begin(client.connect({ process: pidSelector(started.pid) }));
    await client.sendInput({
      process: pidSelector(started.pid),
      input: { input: { case: "stdin", value: bytes("1\n") } },
    });
    const results = await Promise.all([one, two, started].map((s) => collect(rest(s.events))));
    for (const result of results) expect(result).toMatchObject({ output: "fan-1\n", end: { exitCode: 0 } });
  });
});

describe("output replay (Warren-Replay-From / Warren-Output-Offset)", () => {
  it("replays output made while nobody was subscribed, then continues live, with no gap or duplicate", async () => {
    const marker = markerPath("replay");
    const script = `echo one; read x; echo "two-$x"; touch ${marker}; read y; echo "three-$y"`;
    const startHeader = recordOffset();
    const abort = new AbortController();
    const started = await begin(
      client.start(bash(script, { stdin: true }), { signal: abort.signal, onHeader: startHeader.onHeader }),
    );
    expect(startHeader.offset()).toBe("0");
    const firstData = await started.events.next();
    expect(Buffer.from(firstData.value?.event?.event.value?.output?.value ?? []).toString()).toBe("one\n");
    abort.abort();

    // "two-a" is written while no stream is open.
    await client.sendInput({
      process: pidSelector(started.pid),
      input: { input: { case: "stdin", value: bytes("a\n") } },
    });
    await waitUntil(() => existsSync(marker), "the process to print its second line");

    const replayHeader = recordOffset();
    const resumed = await begin(
      client.connect(
        { process: pidSelector(started.pid) },
        { headers: { "Warren-Replay-From": "4" }, onHeader: replayHeader.onHeader },
      ),
    );
    expect(replayHeader.offset()).toBe("4");
    await client.sendInput({
      process: pidSelector(started.pid),
      input: { input: { case: "stdin", value: bytes("b\n") } },
    });
    const result = await collect(rest(resumed.events));
    expect(result.output).toBe("two-a\nthree-b\n");
    expect(result.end).toMatchObject({ exitCode: 0 });
  });

  it("without Warren-Replay-From, Connect delivers live output only and says where it starts", async () => {
    const started = await begin(client.start(bash('echo early; read x; echo "late-$x"', { stdin: true })));
    await started.events.next();
    const header = recordOffset();
    const live = await begin(client.connect({ process: pidSelector(started.pid) }, { onHeader: header.onHeader }));
    expect(header.offset()).toBe(String("early\n".length));
    await client.sendInput({
      process: pidSelector(started.pid),
      input: { input: { case: "stdin", value: bytes("z\n") } },
    });
    expect((await collect(rest(live.events))).output).toBe("late-z\n");
  });

  it("a late Connect after exit gets start, the held output from the oldest kept byte, and the end event", async () => {
    const total = 10_000;
    const finished = await collect(client.start(bash(`head -c ${total - 3} /dev/zero | tr '\\0' x; printf END`)));
    expect(finished.output).toHaveLength(total);
    expect(finished.end).toMatchObject({ exitCode: 0, exited: true });

    const header = recordOffset();
    const replayed = await collect(
      client.connect(
        { process: pidSelector(finished.pid) },
        { headers: { "Warren-Replay-From": "0" }, onHeader: header.onHeader },
      ),
    );
    expect(header.offset()).toBe(String(total - BUFFER_BYTES));
    expect(replayed.pid).toBe(finished.pid);
    expect(replayed.output).toBe(`${"x".repeat(BUFFER_BYTES - 3)}END`);
    expect(replayed.end).toEqual(finished.end);

    const late = await collect(client.connect({ process: pidSelector(finished.pid) }));
    expect(late).toMatchObject({ pid: finished.pid, output: "", end: { exitCode: 0, status: "exit status 0" } });
  });

  it("rejects a replay offset past the end of the output and one that is not an offset", async () => {
    const done = await collect(client.start(bash("printf abc")));
    const connect = (from: string) =>
      first(client.connect({ process: pidSelector(done.pid) }, { headers: { "Warren-Replay-From": from } }));
    await expectCode(connect("4"), Code.OutOfRange, `pid ${done.pid}`);
    await expectCode(connect("-1"), Code.InvalidArgument, "Warren-Replay-From");
    await expectCode(connect("soon"), Code.InvalidArgument, "Warren-Replay-From");
    expect(
      (await collect(client.connect({ process: pidSelector(done.pid) }, { headers: { "Warren-Replay-From": "3" } })))
        .output,
    ).toBe("");
  });
});

describe("stream lifetime", () => {
  it("sends keepalive events at the Keepalive-Ping-Interval while the process is silent", async () => {
    const result = await collect(client.start(bash("sleep 3.5"), { headers: { "Keepalive-Ping-Interval": "1" } }));
    expect(result.keepalives).toBeGreaterThanOrEqual(2);
    expect(result.keepalives).toBeLessThanOrEqual(4);
    expect(result.end).toMatchObject({ exitCode: 0 });
  });

  it("Connect-Timeout-Ms on Start kills the whole process group and ends the stream with deadline_exceeded", async () => {
    const started = await begin(client.start(bash("sleep 30 & echo $!; wait"), { timeoutMs: 1000 }));
    const firstData = await started.events.next();
    const grandchild = Number(Buffer.from(firstData.value?.event?.event.value?.output?.value ?? []).toString());
    expect(running(grandchild)).toBe(true);
    await expectCode(collect(rest(started.events)), Code.DeadlineExceeded);
    await waitUntil(() => !running(started.pid) && !running(grandchild), "the process group to die");
  });

  it("a client disconnect never kills the process; a Connect deadline ends only that stream", async () => {
    const abort = new AbortController();
    const started = await begin(client.start(bash("sleep 30"), { signal: abort.signal, timeoutMs: 0 }));
    abort.abort();
    await expectCode(
      collect(client.connect({ process: pidSelector(started.pid) }, { timeoutMs: 500 })),
      Code.DeadlineExceeded,
    );
    expect(running(started.pid)).toBe(true);
    expect((await client.list({})).processes.map((p) => p.pid)).toContain(started.pid);
    await client.sendSignal({ process: pidSelector(started.pid), signal: Signal.SIGKILL });
    await waitUntil(() => !running(started.pid), "the killed process to go away");
  });

  it("SIGTERM reaches the process group and ends the process with signal: terminated", async () => {
    const started = await begin(client.start(bash("sleep 30 & echo $!; wait")));
    const firstData = await started.events.next();
    const grandchild = Number(Buffer.from(firstData.value?.event?.event.value?.output?.value ?? []).toString());
    await client.sendSignal({ process: pidSelector(started.pid), signal: Signal.SIGTERM });
    const result = await collect(rest(started.events));
    expect(result.end).toEqual({
      exitCode: -1,
      exited: false,
      status: "signal: terminated",
      error: "signal: terminated",
    });
    await waitUntil(() => !running(grandchild), "the background sleep to die");
  });

  it("a stream that is not read holds its process back, and then delivers every byte", async () => {
    const marker = markerPath("backpressure");
    // More than every buffer between the process and this test can hold (the loopback receive
    // buffer here may grow to 32 MiB), so the process cannot finish while nobody reads.
    const size = 64 * 1024 * 1024;
    const started = await begin(client.start(bash(`head -c ${size} /dev/zero; touch ${marker}`)));
    // Nothing is read for a while: the process blocks once envd's and the sockets' buffers are full.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    expect(existsSync(marker)).toBe(false);
    let received = 0;
    let end: unknown;
    for await (const { event } of rest(started.events)) {
      if (event?.event.case === "data") received += event.event.value.output.value?.length ?? 0;
      if (event?.event.case === "end") end = event.event.value;
    }
    expect(received).toBe(size);
    expect(end).toMatchObject({ exitCode: 0 });
    expect(existsSync(marker)).toBe(true);
    // 64 MiB through envd's stream: seconds on a quiet machine, much longer on a loaded shared one.
  }, 120_000);

  it("stopping envd kills the processes it started", async () => {
    const own = await startTestEnvd();
    const started = await begin(connectClient(own).start(bash("sleep 30"), { timeoutMs: 0 }));
    const ended = collect(rest(started.events)).catch(() => undefined);
    await own.stop();
    await ended;
    await waitUntil(() => !running(started.pid), "the process of the stopped envd to die");
  });
});

describe("bad input", () => {
  it("rejects bad Start requests with the right codes and messages, before any start event", async () => {
    await expectCode(first(client.start({ process: { cmd: "" } })), Code.InvalidArgument, "empty");
    await expectCode(first(client.start({})), Code.InvalidArgument, "process");
    await expectCode(
      first(client.start({ process: { cmd: "no-such-command-xyz" } })),
      Code.InvalidArgument,
      "'no-such-command-xyz'",
    );
    await expectCode(first(client.start({ process: { cmd: "/etc/passwd" } })), Code.InvalidArgument, "'/etc/passwd'");
    await expectCode(
      first(client.start({ process: { cmd: "true", envs: { "A=B": "x" } } })),
      Code.InvalidArgument,
      "'A=B'",
    );
    await expectCode(
      first(client.start({ process: { cmd: "true", cwd: "/no/such/dir" } })),
      Code.InvalidArgument,
      "cwd '/no/such/dir' does not exist",
    );
    await expectCode(
      first(
        client.start(
          { process: { cmd: "true" } },
          { headers: { Authorization: `Basic ${Buffer.from("nobody-xyz:").toString("base64")}` } },
        ),
      ),
      Code.Unauthenticated,
      "invalid username: 'nobody-xyz'",
    );
  });

  it("rejects bad selectors, unknown processes and unsupported signals", async () => {
    await expectCode(client.sendSignal({ signal: Signal.SIGKILL }), Code.InvalidArgument, "pid or a tag");
    await expectCode(first(client.connect({})), Code.InvalidArgument, "pid or a tag");
    await expectCode(
      first(client.connect({ process: pidSelector(999_999) })),
      Code.NotFound,
      "process with pid 999999 not found",
    );
    await expectCode(
      client.sendInput({ process: tagSelector("no-such-tag"), input: {} }),
      Code.NotFound,
      "tag 'no-such-tag'",
    );
    const started = await begin(client.start(bash("sleep 30"), { timeoutMs: 0 }));
    const target = pidSelector(started.pid);
    await expectCode(
      client.sendSignal({ process: target, signal: Signal.UNSPECIFIED }),
      Code.Unimplemented,
      "SIGNAL_UNSPECIFIED",
    );
    await expectCode(client.sendSignal({ process: target, signal: 2 as Signal }), Code.Unimplemented, "signal 2");
    expect(running(started.pid)).toBe(true);
    await client.sendSignal({ process: target, signal: Signal.SIGKILL });
    const end = await collect(rest(started.events));
    expect(end.end).toMatchObject({ exitCode: -1, status: "signal: killed" });
    // A finished process can still be connected to, but not signalled.
    await expectCode(
      client.sendSignal({ process: target, signal: Signal.SIGKILL }),
      Code.NotFound,
      `pid ${started.pid}`,
    );
  });

  it("refuses input, close and resize that do not fit the process's kind", async () => {
    const piped = await begin(client.start(bash("sleep 30"), { timeoutMs: 0 }));
    const p = pidSelector(piped.pid);
    await expectCode(
      client.sendInput({ process: p, input: { input: { case: "stdin", value: bytes("x") } } }),
      Code.FailedPrecondition,
      `stdin not enabled or closed for process with pid ${piped.pid}`,
    );
    await expectCode(
      client.sendInput({ process: p, input: { input: { case: "pty", value: bytes("x") } } }),
      Code.FailedPrecondition,
      "no pty",
    );
    await expectCode(client.sendInput({ process: p, input: {} }), Code.InvalidArgument, "stdin or pty");
    await expectCode(
      client.update({ process: p, pty: { size: { cols: 80, rows: 24 } } }),
      Code.FailedPrecondition,
      "tty not assigned",
    );

    const terminal = await begin(
      client.start({ process: { cmd: "/bin/bash" }, pty: { size: { cols: 80, rows: 24 } } }, { timeoutMs: 0 }),
    );
    const t = pidSelector(terminal.pid);
    await expectCode(client.closeStdin({ process: t }), Code.FailedPrecondition, "Ctrl-D");
    await expectCode(
      client.sendInput({ process: t, input: { input: { case: "stdin", value: bytes("x") } } }),
      Code.FailedPrecondition,
      "pty",
    );
    await expectCode(client.update({ process: t, pty: { size: { cols: 0, rows: 24 } } }), Code.InvalidArgument, "cols");
    await client.update({ process: t, pty: { size: { cols: 120, rows: 40 } } });
    await client.sendInput({ process: t, input: { input: { case: "pty", value: bytes("stty size; exit\n") } } });
    const result = await collect(rest(terminal.events));
    expect(result.output).toContain("40 120");
    expect(result.end).toMatchObject({ exitCode: 0 });

    await client.sendSignal({ process: p, signal: Signal.SIGKILL });
    expect((await client.list({})).processes.map((x) => x.pid)).not.toContain(terminal.pid);
  });
});
