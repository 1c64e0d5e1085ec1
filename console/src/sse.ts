import { authHeaders, type Credential } from "./session.js";

/** One Server-Sent Event as the api's ledger stream writes it (`id:`, `event:`, `data:`). */
export interface ServerEvent {
  readonly id: string | undefined;
  readonly event: string;
  readonly data: string;
}

/**
 * Incremental SSE parser (the text/event-stream grammar: fields per line, a blank line ends an event, `:` lines
 * are comments). EventSource cannot send the X-API-Key header, so the console reads the stream with fetch.
 */
export class SseParser {
  private buffer = "";
  private id: string | undefined;
  private event = "";
  private data: string[] = [];

  push(chunk: string): ServerEvent[] {
    this.buffer += chunk;
    const out: ServerEvent[] = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (!match) break;
      // A lone \r at the end may be the first half of \r\n: wait for the next chunk.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const done = this.line(line);
      if (done) out.push(done);
    }
    return out;
  }

  private line(line: string): ServerEvent | undefined {
    if (line === "") {
      if (this.data.length === 0) {
        this.event = "";
        return undefined;
      }
      const event = { id: this.id, event: this.event || "message", data: this.data.join("\n") };
      this.event = "";
      this.data = [];
      return event;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    else if (field === "id" && !value.includes("\0")) this.id = value;
    return undefined;
  }
}

export interface FollowOptions {
  readonly credential: Credential;
  readonly path: string;
  /** Resume after this ledger id (Last-Event-ID). */
  readonly cursor?: string;
  readonly onEvent: (event: ServerEvent) => void;
  readonly onStatus?: (status: "live" | "reconnecting", detail?: string) => void;
}

/**
 * Follows an SSE stream until `stop()`: reconnects with backoff after a drop, resuming from the last id seen, so
 * no event is lost or repeated. A 401/404 ends the follow (reconnecting cannot fix it).
 */
export function followEvents(options: FollowOptions): { stop: () => void } {
  const abort = new AbortController();
  let cursor = options.cursor;
  let attempt = 0;
  const run = async () => {
    while (!abort.signal.aborted) {
      try {
        const headers: Record<string, string> = { ...authHeaders(options.credential), Accept: "text/event-stream" };
        if (cursor !== undefined) headers["Last-Event-ID"] = cursor;
        const res = await fetch(options.path, { headers, signal: abort.signal });
        if (res.status === 401 || res.status === 404) {
          options.onStatus?.("reconnecting", `the event stream answered ${res.status}; not retrying`);
          return;
        }
        if (!res.ok || !res.body) throw new Error(`event stream answered ${res.status}`);
        attempt = 0;
        options.onStatus?.("live");
        const parser = new SseParser();
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          for (const event of parser.push(value)) {
            if (event.id !== undefined) cursor = event.id;
            options.onEvent(event);
          }
        }
        throw new Error("event stream ended");
      } catch (error) {
        if (abort.signal.aborted) return;
        options.onStatus?.("reconnecting", (error as Error).message);
        attempt++;
        await new Promise((resolve) => setTimeout(resolve, Math.min(10_000, 250 * 2 ** attempt)));
      }
    }
  };
  void run();
  return { stop: () => abort.abort() };
}
