import type { FilesystemEvent as RpcFilesystemEvent, WatchDirResponse } from "@warren/proto/filesystem/filesystem_pb";
import { rpcError } from "./errors.js";
import type { FilesystemEvent } from "./files.js";

/** A running directory watch (files.watchDir); stop() ends it. */
export class WatchHandle {
  private stopped = false;
  private readonly done: Promise<void>;

  /** @internal */
  constructor(
    private readonly controller: AbortController,
    private readonly events: AsyncIterator<WatchDirResponse>,
    private readonly onEvent: (event: FilesystemEvent) => void | Promise<void>,
    private readonly onExit: ((err?: Error) => void | Promise<void>) | undefined,
    private readonly map: (event: RpcFilesystemEvent) => FilesystemEvent | undefined,
  ) {
    this.done = this.consume();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.controller.abort();
    await this.done;
  }

  private async consume(): Promise<void> {
    let failure: Error | undefined;
    try {
      for (;;) {
        const next = await this.events.next();
        if (next.done) break;
        if (next.value.event.case !== "filesystem") continue;
        const event = this.map(next.value.event.value);
        if (event) await this.onEvent(event);
      }
    } catch (error) {
      if (!this.stopped) failure = rpcError(error, { files: true });
    }
    await this.onExit?.(failure);
  }
}
