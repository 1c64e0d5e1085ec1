import type { MessageInitShape } from "@bufbuild/protobuf";
import type { WatchDirResponseSchema } from "@warren/proto/filesystem/filesystem_pb";
import type { UserDirectory } from "../users.js";
import type { AccessChecker } from "./permissions.js";
import { DirectoryWatch, type WatchRequest } from "./watch.js";
import type { WatcherRegistry } from "./watcher-registry.js";

type WatchDirMessage = MessageInitShape<typeof WatchDirResponseSchema>;

/** E2B's keepalive default when the client sends no Keepalive-Ping-Interval header. */
export const DEFAULT_KEEPALIVE_SECONDS = 90;
/** Events queued for a client that reads slower than the filesystem changes; the oldest go first. */
const MAX_QUEUED_EVENTS = 4096;

const START: WatchDirMessage = { event: { case: "start", value: {} } };
const KEEPALIVE: WatchDirMessage = { event: { case: "keepalive", value: {} } };

/** Keepalive-Ping-Interval (seconds) as milliseconds; absent or invalid means the default. */
export function keepaliveIntervalMs(header: string | null): number {
  const seconds = Number(header);
  return (header !== null && Number.isFinite(seconds) && seconds > 0 ? seconds : DEFAULT_KEEPALIVE_SECONDS) * 1000;
}

/**
 * A bounded queue from callbacks to an async iterator. When full, the oldest item is
 * dropped (and counted). `fail` ends the iteration at once with that error: after an
 * abort or a deadline nobody wants the queued events.
 */
export class MessageQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private error: { reason: unknown } | undefined;
  private wake: (() => void) | undefined;
  dropped = 0;

  constructor(private readonly capacity: number) {}

  push(item: T): void {
    if (this.error) return;
    if (this.items.length >= this.capacity) {
      this.items.shift();
      this.dropped++;
    }
    this.items.push(item);
    this.wake?.();
  }

  fail(reason: unknown): void {
    this.error ??= { reason };
    this.wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      if (this.error) throw this.error.reason;
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

/**
 * The WatchDir stream: `{start}` once inotify is watching, then events and keepalives
 * (a keepalive after every quiet interval). It ends when `signal` aborts (client gone,
 * Connect-Timeout-Ms deadline, envd shutting down) or the watcher dies; in every case the
 * watcher process is killed before the stream finishes.
 */
export async function* watchDirStream(
  request: WatchRequest,
  access: AccessChecker,
  users: UserDirectory,
  registry: WatcherRegistry,
  keepaliveMs: number,
  signal: AbortSignal,
): AsyncGenerator<WatchDirMessage> {
  const queue = new MessageQueue<WatchDirMessage>(MAX_QUEUED_EVENTS);
  const onAbort = () => queue.fail(signal.reason);
  signal.addEventListener("abort", onAbort, { once: true });
  let keepalive: NodeJS.Timeout | undefined;
  const armKeepalive = () => {
    clearTimeout(keepalive);
    keepalive = setTimeout(() => queue.push(KEEPALIVE), keepaliveMs);
  };
  let watch: DirectoryWatch | undefined;
  try {
    watch = await DirectoryWatch.open(
      request,
      access,
      users,
      { event: (value) => queue.push({ event: { case: "filesystem", value } }), failed: (error) => queue.fail(error) },
      signal,
    );
    registry.track(watch);
    yield START;
    armKeepalive();
    for await (const message of queue) {
      yield message;
      armKeepalive();
    }
  } finally {
    clearTimeout(keepalive);
    signal.removeEventListener("abort", onAbort);
    if (watch) {
      registry.untrack(watch);
      await watch.close();
    }
  }
}
