import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type {
  ConnectResponse,
  ProcessEvent_EndEvent,
  StartRequestSchema,
  StartResponse,
} from "@warren/proto/process/process_pb";
import { sleep } from "./api.js";
import { checkHealth, type EnvdEndpoint, type EnvdRpc } from "./envd.js";
import {
  isTransportError,
  OutputLostError,
  rpcError,
  SANDBOX_GONE_MESSAGE,
  SandboxError,
  TimeoutError,
} from "./errors.js";

/** Request header (Warren extra): replay held output from this byte offset before live output. */
export const REPLAY_FROM_HEADER = "Warren-Replay-From";
/** Response header (Warren extra): offset of the first output byte the stream delivers. */
export const OUTPUT_OFFSET_HEADER = "Warren-Output-Offset";

export type ProcessOutput = { readonly kind: "stdout" | "stderr" | "pty"; readonly data: Uint8Array };
export type ProcessEnd = {
  readonly kind: "end";
  readonly exitCode: number;
  readonly exited: boolean;
  readonly status: string;
  readonly error?: string;
};

/** How a stream survives drops. Warren's defaults: reconnect for up to a minute per drop. */
export interface StreamResilience {
  /** Reconnect (with replay) when the stream drops. Default true. */
  reconnect?: boolean;
  /** How long to keep trying to reconnect after one drop, in ms. Default 60 000. */
  reconnectWindowMs?: number;
  /** envd sends a keepalive after this many idle seconds. Default 30. */
  keepaliveIntervalS?: number;
  /** A stream silent for this long (no output, no keepalive) counts as dropped. Default 2.5 × keepalive. */
  idleTimeoutMs?: number;
}

export interface ProcessStreamOptions extends StreamResilience {
  /** How long to wait for a stream's start event, in ms (0 = no limit). */
  requestTimeoutMs?: number;
  /** The caller's own deadline for the process (absolute, ms since epoch). */
  deadline?: number;
  /** The caller's signal: aborting it ends the stream (the process keeps running). */
  signal?: AbortSignal;
  /** Called when a resumed stream finds output that the sandbox no longer holds. */
  onOutputLost?: (lost: OutputLostError) => void;
}

type Message = StartResponse | ConnectResponse;

class IdleTimeout extends Error {}

/**
 * One process's output stream that outlives its connections: when the Start/Connect stream drops
 * (socket reset, proxy restart, silent half-open connection), it reconnects with
 * `Warren-Replay-From: <next byte>` and goes on, so every byte arrives exactly once. If the sandbox
 * no longer held some bytes, the gap is reported, never hidden.
 */
export class ProcessStream {
  /** Offset of the next output byte this stream expects (undefined if envd does not number output). */
  offset: number | undefined;
  readonly lost: OutputLostError[] = [];
  private iterator: AsyncIterator<Message> | undefined;
  private attempt: AbortController | undefined;
  private closed = false;
  private reconnects = 0;

  private constructor(
    readonly pid: number,
    private readonly rpc: EnvdRpc,
    private readonly endpoint: EnvdEndpoint,
    private readonly options: ProcessStreamOptions,
  ) {}

  /** Number of times the stream was re-established after a drop. */
  get reconnectCount(): number {
    return this.reconnects;
  }

  /** Starts a process (process.Process/Start) and waits for its start event. */
  static async start(
    rpc: EnvdRpc,
    endpoint: EnvdEndpoint,
    request: MessageInitShape<typeof StartRequestSchema>,
    headers: Record<string, string>,
    options: ProcessStreamOptions,
  ): Promise<ProcessStream> {
    const attempt = new AbortController();
    let offset: number | undefined;
    const signal = combine(attempt.signal, options.signal);
    try {
      const responses = rpc.process.start(request, {
        signal,
        headers: { ...headers, "Keepalive-Ping-Interval": String(keepaliveSeconds(options)) },
        timeoutMs: remaining(options.deadline),
        onHeader: (h) => {
          offset = parseOffset(h.get(OUTPUT_OFFSET_HEADER));
        },
      });
      const iterator = responses[Symbol.asyncIterator]();
      const first = await firstMessage(iterator, options.requestTimeoutMs, attempt);
      const event = first.done ? undefined : first.value.event?.event;
      if (event?.case !== "start") throw new SandboxError("Expected start event");
      const stream = new ProcessStream(event.value.pid, rpc, endpoint, options);
      stream.iterator = iterator;
      stream.attempt = attempt;
      // A Start stream begins with the process's first byte, numbered or not.
      stream.offset = offset ?? 0;
      return stream;
    } catch (error) {
      attempt.abort();
      throw startError(error);
    }
  }

  /**
   * Attaches to a running process (process.Process/Connect). With `replayFrom`, output from that
   * byte offset that the sandbox still holds comes first (a terminal's scrollback).
   */
  static async connect(
    rpc: EnvdRpc,
    endpoint: EnvdEndpoint,
    pid: number,
    options: ProcessStreamOptions & { replayFrom?: number; scrollback?: boolean },
  ): Promise<ProcessStream> {
    const stream = new ProcessStream(pid, rpc, endpoint, options);
    try {
      await stream.open(options.replayFrom, options.scrollback === true);
    } catch (error) {
      throw startError(error);
    }
    return stream;
  }

  /** Ends the stream; the process keeps running. */
  close(): void {
    this.closed = true;
    this.attempt?.abort();
  }

  /** Output then the end event; transparently reconnects after drops. Ends quietly after close(). */
  async *events(): AsyncGenerator<ProcessOutput | ProcessEnd> {
    for (;;) {
      try {
        for (;;) {
          const result = await this.next();
          if (result.done) throw new ConnectError("stream ended without an end event", Code.Aborted);
          const event = result.value.event?.event;
          if (event?.case === "data") {
            const output = event.value.output;
            if (output.case === undefined) continue;
            if (this.offset !== undefined) this.offset += output.value.length;
            yield { kind: output.case, data: output.value };
          } else if (event?.case === "end") {
            yield endOf(event.value);
            return;
          }
        }
      } catch (error) {
        if (this.closed) return;
        if (this.options.signal?.aborted || !isRetryable(error) || this.options.reconnect === false) {
          throw rpcError(error);
        }
        await this.reconnect(error);
        if (this.closed) return;
      }
    }
  }

  private async next(): Promise<IteratorResult<Message>> {
    const iterator = this.iterator;
    if (!iterator) throw new ConnectError("no stream", Code.Aborted);
    const idleMs = this.options.idleTimeoutMs ?? keepaliveSeconds(this.options) * 2500;
    let timer: NodeJS.Timeout | undefined;
    const idle = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        reject(new IdleTimeout(`no message for ${idleMs} ms`));
        this.attempt?.abort();
      }, idleMs);
    });
    try {
      return await Promise.race([iterator.next(), idle]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Opens a Connect stream, replaying from `replayFrom` if given, and checks what it starts at. */
  private async open(replayFrom: number | undefined, scrollback = false): Promise<void> {
    const attempt = new AbortController();
    let first: number | undefined;
    const headers: Record<string, string> = { "Keepalive-Ping-Interval": String(keepaliveSeconds(this.options)) };
    if (replayFrom !== undefined) headers[REPLAY_FROM_HEADER] = String(replayFrom);
    try {
      const responses = this.rpc.process.connect(
        { process: { selector: { case: "pid", value: this.pid } } },
        {
          signal: combine(attempt.signal, this.options.signal),
          headers,
          timeoutMs: remaining(this.options.deadline),
          onHeader: (h) => {
            first = parseOffset(h.get(OUTPUT_OFFSET_HEADER));
          },
        },
      );
      const iterator = responses[Symbol.asyncIterator]();
      const start = await firstMessage(iterator, this.options.requestTimeoutMs, attempt);
      if (start.done || start.value.event?.event.case !== "start") throw new SandboxError("Expected start event");
      this.attempt?.abort();
      this.attempt = attempt;
      this.iterator = iterator;
    } catch (error) {
      attempt.abort();
      throw error;
    }
    if (scrollback) {
      // Scrollback starts wherever the sandbox's buffer starts: that is not a loss.
    } else if (replayFrom !== undefined && first === undefined) {
      this.reportLost(new OutputLostError(this.pid, replayFrom, undefined));
    } else if (replayFrom !== undefined && first !== undefined && first > replayFrom) {
      this.reportLost(new OutputLostError(this.pid, replayFrom, first));
    }
    this.offset = first;
  }

  private reportLost(lost: OutputLostError): void {
    this.lost.push(lost);
    this.options.onOutputLost?.(lost);
  }

  /** Re-establishes the stream after a drop, or throws why it cannot be. */
  private async reconnect(cause: unknown): Promise<void> {
    const window = this.options.reconnectWindowMs ?? 60_000;
    const startedAt = Date.now();
    this.attempt?.abort();
    for (let attempt = 0; ; attempt++) {
      if (this.closed) return;
      if (this.options.deadline !== undefined && Date.now() >= this.options.deadline) {
        throw new TimeoutError(`the timeout of pid ${this.pid} passed while its stream was reconnecting`, { cause });
      }
      try {
        // Without numbered output (an envd that does not replay) the gap is reported as unknown.
        await this.open(this.offset ?? 0);
        this.reconnects++;
        return;
      } catch (error) {
        if (this.closed) return;
        if (error instanceof ConnectError && error.code === Code.NotFound) {
          throw new SandboxError(
            `the stream of pid ${this.pid} dropped and the process is gone (it ended longer ago than the sandbox remembers)`,
            { cause: error },
          );
        }
        if (!isRetryable(error)) throw rpcError(error);
        if ((await checkHealth(this.endpoint)) === false)
          throw new TimeoutError(SANDBOX_GONE_MESSAGE, { cause: error });
        if (Date.now() - startedAt >= window) {
          throw new TimeoutError(
            `the stream of pid ${this.pid} dropped and could not be re-established within ${window} ms`,
            { cause: error },
          );
        }
        await sleep(Math.min(100 * 2 ** attempt, 2_000), this.options.signal).catch(() => undefined);
      }
    }
  }
}

function isRetryable(error: unknown): boolean {
  if (error instanceof IdleTimeout) return true;
  if (isTransportError(error)) return true;
  // A response that ended cleanly but early (a proxy closing its side) is a drop too.
  if (error instanceof ConnectError && error.rawMessage === "protocol error: missing EndStreamResponse") return true;
  // Unavailable: the proxy answered 502/503 or envd refused the connection (it may come back).
  return error instanceof ConnectError && error.code === Code.Unavailable;
}

/** The first message of a stream, or IdleTimeout if it does not come within `timeoutMs`. */
async function firstMessage(
  iterator: AsyncIterator<Message>,
  timeoutMs: number | undefined,
  attempt: AbortController,
): Promise<IteratorResult<Message>> {
  if (timeoutMs === undefined || timeoutMs <= 0) return iterator.next();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new IdleTimeout(`no start event within ${timeoutMs} ms`));
      attempt.abort();
    }, timeoutMs);
  });
  try {
    return await Promise.race([iterator.next(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function startError(error: unknown): Error {
  if (error instanceof IdleTimeout) {
    return new TimeoutError(
      `${error.message}: This error is likely due to exceeding 'requestTimeoutMs'. You can pass the request timeout value as an option when making the request.`,
    );
  }
  return rpcError(error);
}

function endOf(end: ProcessEvent_EndEvent): ProcessEnd {
  return {
    kind: "end",
    exitCode: end.exitCode,
    exited: end.exited,
    status: end.status,
    ...(end.error !== undefined ? { error: end.error } : {}),
  };
}

function keepaliveSeconds(options: StreamResilience): number {
  return options.keepaliveIntervalS ?? 30;
}

function remaining(deadline: number | undefined): number | undefined {
  if (deadline === undefined) return undefined;
  return Math.max(deadline - Date.now(), 1);
}

function parseOffset(header: string | null): number | undefined {
  if (header === null || !/^\d+$/.test(header.trim())) return undefined;
  return Number(header.trim());
}

export function combine(...signals: Array<AbortSignal | undefined>): AbortSignal {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  return present.length === 1 ? (present[0] as AbortSignal) : AbortSignal.any(present);
}
