import { realpath, stat } from "node:fs/promises";
import { dirname, relative } from "node:path";
import { create } from "@bufbuild/protobuf";
import { EventType, type FilesystemEvent, FilesystemEventSchema } from "@warren/proto/filesystem/filesystem_pb";
import { type EnvdError, fromFsError, invalidArgument } from "../errors.js";
import type { UserDirectory } from "../users.js";
import { entryInfo } from "./entry-info.js";
import { isOnNetworkMount } from "./mounts.js";
import { type AccessChecker, mayAccess, READ, SEARCH } from "./permissions.js";
import type { WatchEvent } from "./watch-events.js";
import { DirectoryWatcher } from "./watcher.js";

export interface WatchRequest {
  /** Resolved (absolute) path of the directory; event names are relative to it. */
  readonly path: string;
  readonly recursive: boolean;
  readonly includeEntry: boolean;
  readonly allowNetworkMounts: boolean;
}

export interface WatchListener {
  event(event: FilesystemEvent): void;
  failed(error: EnvdError): void;
}

/** Only these carry an entry, as in E2B: the others describe something that is gone. */
const WITH_ENTRY = new Set([EventType.CREATE, EventType.WRITE, EventType.CHMOD]);

/**
 * A running watch for one user: inotify events become E2B FilesystemEvents (name relative
 * to the watched directory, entry when asked), delivered in order. Events from
 * subdirectories the user could not list are not shown to them.
 */
export class DirectoryWatch {
  private delivery: Promise<void> = Promise.resolve();
  private stopped = false;
  private watcher: DirectoryWatcher | undefined;

  private constructor(
    private readonly request: WatchRequest,
    private readonly access: AccessChecker,
    private readonly users: UserDirectory,
    private readonly listener: WatchListener,
  ) {}

  /**
   * Checks the directory (missing ⇒ not_found, not a directory or on a network mount ⇒
   * invalid_argument, not listable ⇒ permission_denied) and resolves once the watch is live.
   */
  static async open(
    request: WatchRequest,
    access: AccessChecker,
    users: UserDirectory,
    listener: WatchListener,
    signal?: AbortSignal,
  ): Promise<DirectoryWatch> {
    await access.assertReachable(request.path);
    const info = await stat(request.path).catch((error: unknown) => {
      throw fromFsError(error, request.path);
    });
    if (!info.isDirectory()) throw invalidArgument(`path '${request.path}' is not a directory`);
    await access.assertListable(request.path);
    if (!request.allowNetworkMounts) {
      const resolved = await realpath(request.path).catch(() => request.path);
      if (await isOnNetworkMount(resolved)) {
        throw invalidArgument(
          `cannot watch path on network filesystem: '${request.path}' (pass allowNetworkMounts to watch it anyway)`,
        );
      }
    }
    const watch = new DirectoryWatch(request, access, users, listener);
    watch.watcher = await DirectoryWatcher.start(
      { path: request.path, recursive: request.recursive },
      { event: (event) => watch.enqueue(event), failed: (error) => watch.fail(error) },
      signal,
    );
    return watch;
  }

  async close(): Promise<void> {
    this.stopped = true;
    await this.watcher?.close();
  }

  private enqueue(event: WatchEvent): void {
    // A failed stat only loses that event's entry; the chain itself must never reject.
    this.delivery = this.delivery.then(() => this.deliver(event)).catch(() => {});
  }

  private fail(error: EnvdError): void {
    this.delivery = this.delivery.then(() => {
      if (!this.stopped) this.listener.failed(error);
    });
  }

  private async deliver(event: WatchEvent): Promise<void> {
    if (this.stopped || !(await this.visible(event.path))) return;
    const name = relative(this.request.path, event.path) || ".";
    let entry: FilesystemEvent["entry"];
    if (this.request.includeEntry && WITH_ENTRY.has(event.type)) {
      entry = await entryInfo(event.path, this.users).catch(() => undefined);
    }
    if (!this.stopped) this.listener.event(create(FilesystemEventSchema, { name, type: event.type, entry }));
  }

  /** Whether the user may list every directory between the watched one and the event's. */
  private async visible(path: string): Promise<boolean> {
    if (this.access.unrestricted) return true;
    for (let dir = dirname(path); dir.length > this.request.path.length; dir = dirname(dir)) {
      const info = await stat(dir).catch(() => undefined);
      if (info && !mayAccess(this.access.user, info, READ | SEARCH)) return false;
    }
    return true;
  }
}
