import { randomUUID } from "node:crypto";

import type { FilesystemEvent } from "@warren/proto/filesystem/filesystem_pb";
import { type EnvdError, notFound, resourceExhausted, unavailable } from "../errors.js";
import type { Logger } from "../log.js";
import type { UserDirectory } from "../users.js";
import type { AccessChecker } from "./permissions.js";
import { DirectoryWatch, type WatchRequest } from "./watch.js";

/** Events a polling watcher keeps between polls; beyond it the oldest are dropped. */
export const MAX_BUFFERED_EVENTS = 10_000;
/** Polling watchers alive at once; each is an inotifywait process. */
export const MAX_POLLING_WATCHERS = 256;

/** What a polling watcher has seen since the last poll. */
interface EventBuffer {
  events: FilesystemEvent[];
  error: EnvdError | undefined;
  dropped: number;
}

interface PollingWatcher {
  readonly watch: DirectoryWatch;
  readonly buffer: EventBuffer;
}

/**
 * Owns every watch envd runs: the polling watchers of CreateWatcher/GetWatcherEvents/
 * RemoveWatcher (ids are random, so the id is the capability) and the watches behind open
 * WatchDir streams, so that `close` can end them all.
 */
export class WatcherRegistry {
  private readonly polling = new Map<string, PollingWatcher>();
  private readonly streaming = new Set<DirectoryWatch>();
  private readonly shutdown = new AbortController();

  constructor(private readonly log: Logger) {}

  /** Aborts when envd shuts down; WatchDir streams listen to it. */
  get shutdownSignal(): AbortSignal {
    return this.shutdown.signal;
  }

  track(watch: DirectoryWatch): void {
    this.streaming.add(watch);
  }

  untrack(watch: DirectoryWatch): void {
    this.streaming.delete(watch);
  }

  async create(request: WatchRequest, access: AccessChecker, users: UserDirectory): Promise<string> {
    if (this.polling.size >= MAX_POLLING_WATCHERS) {
      throw resourceExhausted(`too many watchers (${MAX_POLLING_WATCHERS}); remove unused ones first`);
    }
    const id = `w${randomUUID()}`;
    const buffer: EventBuffer = { events: [], error: undefined, dropped: 0 };
    const watch = await DirectoryWatch.open(
      request,
      access,
      users,
      {
        event: (event) => this.append(buffer, event, id),
        failed: (error) => {
          buffer.error = error;
        },
      },
      this.shutdown.signal,
    );
    if (this.shutdown.signal.aborted) {
      await watch.close();
      throw unavailable("envd is shutting down");
    }
    this.polling.set(id, { watch, buffer });
    return id;
  }

  /** The events since the last poll; a dead watcher's error once its events are consumed. */
  drain(id: string): FilesystemEvent[] {
    const { buffer } = this.get(id);
    if (buffer.events.length === 0 && buffer.error) throw buffer.error;
    const events = buffer.events;
    buffer.events = [];
    buffer.dropped = 0;
    return events;
  }

  async remove(id: string): Promise<void> {
    const entry = this.get(id);
    this.polling.delete(id);
    await entry.watch.close();
  }

  async close(): Promise<void> {
    this.shutdown.abort(unavailable("envd is shutting down"));
    const watches = [...[...this.polling.values()].map((entry) => entry.watch), ...this.streaming];
    this.polling.clear();
    this.streaming.clear();
    await Promise.all(watches.map((watch) => watch.close()));
  }

  private get(id: string): PollingWatcher {
    const entry = this.polling.get(id);
    if (!entry) throw notFound(`watcher with id '${id}' not found`);
    return entry;
  }

  private append(buffer: EventBuffer, event: FilesystemEvent, id: string): void {
    if (buffer.events.length >= MAX_BUFFERED_EVENTS) {
      buffer.events.shift();
      if (buffer.dropped++ === 0) {
        this.log.warn("watcher buffer full, dropping oldest events", { watcherId: id, limit: MAX_BUFFERED_EVENTS });
      }
    }
    buffer.events.push(event);
  }
}
