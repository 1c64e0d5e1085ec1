import { Code, ConnectError } from "@connectrpc/connect";
import { type ConnectResponse, Signal, type StartResponse } from "@warren/proto/process/process_pb";
import { type EnvdConnection, REPLAY_FROM_HEADER } from "./envd.js";

const OUTPUT_OFFSET_HEADER = "Warren-Output-Offset";
/** envd sends a keepalive event this often, so a proxy never sees an idle stream. */
const KEEPALIVE_SECONDS = "30";

export type PtyStatus = "starting" | "live" | "reconnecting" | "ended" | "failed";

export interface PtyCallbacks {
  readonly onData: (bytes: Uint8Array) => void;
  readonly onStatus: (status: PtyStatus, detail?: string) => void;
}

/**
 * One shell in a sandbox behind a PTY (envd process.Start with `pty`), its output numbered by byte offset. When
 * the stream drops, it re-attaches (process.Connect) asking envd to replay from the last byte it showed, so a
 * network drop loses nothing the sandbox still holds.
 */
export class PtySession {
  pid: number | undefined;
  private offset = 0;
  private closed = false;
  private abort = new AbortController();
  private input: Promise<void> = Promise.resolve();

  constructor(
    private readonly envd: EnvdConnection,
    private readonly callbacks: PtyCallbacks,
  ) {}

  async start(cols: number, rows: number): Promise<void> {
    this.callbacks.onStatus("starting");
    const stream = this.envd.process.start(
      {
        process: {
          cmd: "/bin/bash",
          args: ["-i", "-l"],
          envs: { TERM: "xterm-256color", LANG: "C.UTF-8", LC_ALL: "C.UTF-8" },
        },
        pty: { size: { cols, rows } },
      },
      {
        signal: this.abort.signal,
        headers: { "Keepalive-Ping-Interval": KEEPALIVE_SECONDS },
        onHeader: (h) => {
          this.offset = Number(h.get(OUTPUT_OFFSET_HEADER) ?? 0) || 0;
        },
      },
    );
    void this.consume(stream);
  }

  private async consume(stream: AsyncIterable<StartResponse | ConnectResponse>): Promise<void> {
    try {
      for await (const message of stream) {
        const event = message.event?.event;
        if (event?.case === "start") {
          this.pid = event.value.pid;
          this.callbacks.onStatus("live");
        } else if (event?.case === "data" && event.value.output.case === "pty") {
          this.offset += event.value.output.value.length;
          this.callbacks.onData(event.value.output.value);
        } else if (event?.case === "end") {
          this.closed = true;
          this.callbacks.onStatus("ended", event.value.error || event.value.status);
          return;
        }
      }
      throw new ConnectError("the stream ended without the process ending", Code.Unavailable);
    } catch (error) {
      if (this.closed) return;
      if (this.pid === undefined) {
        this.callbacks.onStatus("failed", error instanceof ConnectError ? error.rawMessage : String(error));
        return;
      }
      await this.reconnect();
    }
  }

  /** Re-attaches to the shell, replaying what was missed; retries with backoff for up to a minute. */
  private async reconnect(): Promise<void> {
    if (this.closed || this.pid === undefined) return;
    this.abort = new AbortController();
    const deadline = Date.now() + 60_000;
    for (let attempt = 0; !this.closed; attempt++) {
      this.callbacks.onStatus("reconnecting");
      try {
        const requested = this.offset;
        let first: number | undefined;
        const stream = this.envd.process.connect(
          { process: { selector: { case: "pid", value: this.pid } } },
          {
            signal: this.abort.signal,
            headers: { [REPLAY_FROM_HEADER]: String(requested), "Keepalive-Ping-Interval": KEEPALIVE_SECONDS },
            onHeader: (h) => {
              const value = h.get(OUTPUT_OFFSET_HEADER);
              first = value === null ? undefined : Number(value);
            },
          },
        );
        const iterator = stream[Symbol.asyncIterator]();
        const head = await iterator.next();
        if (head.done) throw new ConnectError("the stream ended at once", Code.Unavailable);
        if (first !== undefined && first > requested) {
          this.callbacks.onData(
            new TextEncoder().encode(`\r\n[console: ${first - requested} bytes of output were lost while away]\r\n`),
          );
        }
        this.offset = first ?? requested;
        void this.consume({ [Symbol.asyncIterator]: () => prepend(head.value, iterator) });
        return;
      } catch (error) {
        if (error instanceof ConnectError && error.code === Code.NotFound) {
          this.closed = true;
          this.callbacks.onStatus("ended", "the shell is gone");
          return;
        }
        if (Date.now() > deadline) {
          this.callbacks.onStatus("failed", `could not reconnect: ${(error as Error).message}`);
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** attempt, 4000)));
      }
    }
  }

  /**
   * Keystrokes in order (Ctrl-C is the byte 0x03 like any other key). Keys typed while the network is down are
   * held and sent, still in order, once envd answers again.
   */
  send(data: string): void {
    const pid = this.pid;
    if (pid === undefined || this.closed) return;
    const bytes = new TextEncoder().encode(data);
    this.input = this.input.then(() => this.deliver(pid, bytes));
  }

  private async deliver(pid: number, bytes: Uint8Array): Promise<void> {
    for (let attempt = 0; !this.closed; attempt++) {
      try {
        await this.envd.process.sendInput({
          process: { selector: { case: "pid", value: pid } },
          input: { input: { case: "pty", value: bytes } },
        });
        return;
      } catch (error) {
        // Only a failed transport is worth retrying; envd's own refusal (the shell is gone) is final.
        const code = error instanceof ConnectError ? error.code : undefined;
        if (code !== Code.Unknown && code !== Code.Unavailable) return;
        await new Promise((resolve) => setTimeout(resolve, Math.min(250 * 2 ** attempt, 2000)));
      }
    }
  }

  resize(cols: number, rows: number): void {
    const pid = this.pid;
    if (pid === undefined || this.closed) return;
    void this.envd.process
      .update({ process: { selector: { case: "pid", value: pid } }, pty: { size: { cols, rows } } })
      .catch(() => undefined);
  }

  /** Detaches; the shell is killed so it does not outlive the page that started it. */
  close(): void {
    const pid = this.pid;
    this.closed = true;
    this.abort.abort();
    if (pid !== undefined) {
      void this.envd.process
        .sendSignal({ process: { selector: { case: "pid", value: pid } }, signal: Signal.SIGKILL })
        .catch(() => undefined);
    }
  }

  /** The reconnect button: cut the stream as a network drop would; the session re-attaches with replay. */
  dropStream(): void {
    this.abort.abort();
  }
}

function prepend<T>(first: T, rest: AsyncIterator<T>): AsyncIterator<T> {
  let sentFirst = false;
  return {
    next: () => {
      if (!sentFirst) {
        sentFirst = true;
        return Promise.resolve({ value: first, done: false });
      }
      return rest.next();
    },
  };
}
