import { ApiClient, sleep } from "./api.js";
import type { ConnectionConfig } from "./config.js";
import { apiError, SandboxError } from "./errors.js";

/** One entry of a sandbox's event ledger (Warren extra). `id` is the cursor to resume after it. */
export interface SandboxEvent {
  id: string;
  sandboxId: string;
  type: string;
  fromState?: string;
  toState?: string;
  data: Record<string, unknown>;
  timestamp: Date;
}

export interface SandboxEventsOpts {
  /** Start after this event id (exclusive). Default: the beginning of the ledger. */
  cursor?: string;
  /**
   * Keep following new events (Server-Sent Events, resumed with `Last-Event-ID` after a drop)
   * instead of ending when the ledger is read. Default false.
   */
  follow?: boolean;
  /** Page size when reading (not following). Default: the server's. */
  limit?: number;
  signal?: AbortSignal;
}

/** Ledger paths the api serves (see the SDK README: the contract the api must match). */
export const eventsPath = (sandboxId: string) => `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/events`;
export const eventsStreamPath = (sandboxId: string) => `${eventsPath(sandboxId)}/stream`;

/**
 * A sandbox's ledger as an async iterator. Reading pages `GET …/events?cursor=<id>` until a page
 * is empty; following reads `GET …/events/stream` (SSE) and reconnects with `Last-Event-ID`, so
 * a drop neither loses nor repeats an event.
 */
export async function* sandboxEvents(
  config: ConnectionConfig,
  sandboxId: string,
  opts: SandboxEventsOpts = {},
): AsyncGenerator<SandboxEvent> {
  const api = new ApiClient(config);
  let cursor = opts.cursor;
  if (!opts.follow) {
    for (;;) {
      const res = await api.request<unknown>({
        method: "GET",
        path: eventsPath(sandboxId),
        query: { cursor, limit: opts.limit === undefined ? undefined : String(opts.limit) },
        signal: opts.signal,
      });
      const page = eventsOf(res.body);
      if (page.length === 0) return;
      for (const event of page) {
        cursor = event.id;
        yield event;
      }
    }
  }
  for (let failures = 0; ; ) {
    if (opts.signal?.aborted) return;
    let res: Response;
    try {
      res = await fetch(new URL(config.apiUrl + eventsStreamPath(sandboxId)), {
        headers: api.headers({ Accept: "text/event-stream", ...(cursor ? { "Last-Event-ID": cursor } : {}) }),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
    } catch (error) {
      if (opts.signal?.aborted) return;
      if (++failures > config.retries + 5) throw new SandboxError(`event stream failed: ${(error as Error).message}`);
      await sleep(Math.min(200 * 2 ** failures, 5_000), opts.signal).catch(() => undefined);
      continue;
    }
    if (!res.ok || !res.body) throw apiError(res.status, await res.text());
    try {
      for await (const message of serverSentEvents(res.body)) {
        if (message.data === undefined) continue;
        failures = 0;
        const event = eventOf(JSON.parse(message.data) as Record<string, unknown>, message.id);
        cursor = event.id;
        yield event;
      }
    } catch (error) {
      if (opts.signal?.aborted) return;
      if (++failures > config.retries + 5) throw new SandboxError(`event stream failed: ${(error as Error).message}`);
    }
    // The server ended the stream (or it dropped): resume after the last event seen.
    await sleep(Math.min(100 * 2 ** failures, 5_000), opts.signal).catch(() => undefined);
  }
}

function eventsOf(body: unknown): SandboxEvent[] {
  const list = Array.isArray(body) ? body : (body as { events?: unknown } | undefined)?.events;
  if (!Array.isArray(list)) throw new SandboxError("the events page is not a list");
  return list.map((e) => eventOf(e as Record<string, unknown>));
}

function eventOf(raw: Record<string, unknown>, sseId?: string): SandboxEvent {
  const id = raw.id ?? raw.cursor ?? sseId;
  if (id === undefined) throw new SandboxError("an event has no id");
  return {
    id: String(id),
    sandboxId: String(raw.sandboxID ?? raw.sandboxId ?? ""),
    type: String(raw.type),
    ...(typeof raw.fromState === "string" ? { fromState: raw.fromState } : {}),
    ...(typeof raw.toState === "string" ? { toState: raw.toState } : {}),
    data: (raw.data as Record<string, unknown> | undefined) ?? {},
    timestamp: new Date(String(raw.timestamp)),
  };
}

interface SseMessage {
  id?: string;
  event?: string;
  data?: string;
}

/** Parses a text/event-stream body into messages (comments and retry fields ignored). */
export async function* serverSentEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  const decoder = new TextDecoder();
  let buffer = "";
  let message: SseMessage = {};
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let newline = buffer.search(/\r?\n/);
    while (newline !== -1) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(buffer[newline] === "\r" ? newline + 2 : newline + 1);
      if (line === "") {
        if (message.data !== undefined || message.id !== undefined) yield message;
        message = {};
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        const value = colon === -1 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") message.id = value;
        else if (field === "event") message.event = value;
        else if (field === "data") message.data = message.data === undefined ? value : `${message.data}\n${value}`;
      }
      newline = buffer.search(/\r?\n/);
    }
  }
}
