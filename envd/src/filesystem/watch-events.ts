import { EventType } from "@warren/proto/filesystem/filesystem_pb";

/** One line of inotifywait output: its event names (MODIFY, CREATE, ISDIR, ...) and the full path. */
export interface InotifyRecord {
  readonly flags: ReadonlySet<string>;
  readonly path: string;
}

/** A filesystem change as E2B reports it: an fsnotify-style operation on an absolute path. */
export interface WatchEvent {
  readonly type: EventType;
  readonly path: string;
}

/** The inotify events asked of inotifywait; the rest (access, open, close_nowrite) are noise. */
export const INOTIFY_EVENTS = "create,modify,close_write,attrib,delete,moved_from,moved_to,delete_self,move_self";

/** `--format` with NUL after each field, so any byte in a file name (even a newline) parses. */
export const INOTIFY_FORMAT = "%e%0%w%f%0";

/**
 * Splits inotifywait's NUL-separated output (`EVENTS\0PATH\0` per event) into records,
 * keeping a partial record across chunks.
 */
export class InotifyOutputParser {
  private pending: Buffer = Buffer.alloc(0);
  private flags: string | undefined;

  push(chunk: Buffer): InotifyRecord[] {
    const data = this.pending.length ? Buffer.concat([this.pending, chunk]) : chunk;
    const records: InotifyRecord[] = [];
    let start = 0;
    for (let end = data.indexOf(0, start); end !== -1; end = data.indexOf(0, start)) {
      const field = data.toString("utf8", start, end);
      start = end + 1;
      if (this.flags === undefined) {
        this.flags = field;
      } else {
        records.push({ flags: new Set(this.flags.split(",")), path: field });
        this.flags = undefined;
      }
    }
    this.pending = data.subarray(start);
    return records;
  }
}

interface WriteBurst {
  timer: NodeJS.Timeout;
  /** A MODIFY arrived after the last WRITE was reported. */
  pending: boolean;
}

/**
 * Turns inotify records into E2B events the way fsnotify names them (MOVED_TO is CREATE,
 * MOVED_FROM is RENAME, ATTRIB is CHMOD, DELETE is REMOVE; the watched directory's own
 * DELETE_SELF/MOVE_SELF are REMOVE/RENAME of "."), and tames MODIFY storms: the first
 * MODIFY of a path is a WRITE at once, further ones within `windowMs` fold into one
 * trailing WRITE, and CLOSE_WRITE reports a WRITE unless one was just reported with
 * nothing after it. So a write always ends with a WRITE event, even an empty one.
 */
export class InotifyEventMapper {
  private readonly bursts = new Map<string, WriteBurst>();

  constructor(
    private readonly root: string,
    private readonly emit: (event: WatchEvent) => void,
    private readonly windowMs = 100,
  ) {}

  handle(record: InotifyRecord): void {
    const path = record.path.length > 1 && record.path.endsWith("/") ? record.path.slice(0, -1) : record.path;
    const { flags } = record;
    if (flags.has("DELETE_SELF") || flags.has("MOVE_SELF")) {
      // Subdirectories of a recursive watch report these too; their parent already said so.
      if (path !== this.root) return;
      this.flush(path);
      this.emit({ type: flags.has("DELETE_SELF") ? EventType.REMOVE : EventType.RENAME, path });
      return;
    }
    if (flags.has("CREATE") || flags.has("MOVED_TO")) this.emit({ type: EventType.CREATE, path });
    if (flags.has("MOVED_FROM")) {
      this.flush(path);
      this.emit({ type: EventType.RENAME, path });
    }
    if (flags.has("ATTRIB")) this.emit({ type: EventType.CHMOD, path });
    if (flags.has("MODIFY")) this.modified(path);
    if (flags.has("CLOSE_WRITE")) this.closedAfterWrite(path);
    if (flags.has("DELETE")) {
      this.flush(path);
      this.emit({ type: EventType.REMOVE, path });
    }
  }

  /** Drops pending trailing WRITEs; the watch is over. */
  close(): void {
    for (const burst of this.bursts.values()) clearTimeout(burst.timer);
    this.bursts.clear();
  }

  private modified(path: string): void {
    const burst = this.bursts.get(path);
    if (burst) {
      burst.pending = true;
      return;
    }
    this.emit({ type: EventType.WRITE, path });
    this.bursts.set(path, { timer: this.expireLater(path), pending: false });
  }

  private expireLater(path: string): NodeJS.Timeout {
    const timer = setTimeout(() => {
      const burst = this.bursts.get(path);
      if (!burst) return;
      if (!burst.pending) {
        this.bursts.delete(path);
        return;
      }
      burst.pending = false;
      this.emit({ type: EventType.WRITE, path });
      burst.timer = this.expireLater(path);
    }, this.windowMs);
    timer.unref();
    return timer;
  }

  private closedAfterWrite(path: string): void {
    const burst = this.bursts.get(path);
    if (!burst) {
      this.emit({ type: EventType.WRITE, path });
      return;
    }
    this.flush(path);
  }

  /** Reports a folded WRITE now, before an event that must come after it. */
  private flush(path: string): void {
    const burst = this.bursts.get(path);
    if (!burst) return;
    clearTimeout(burst.timer);
    this.bursts.delete(path);
    if (burst.pending) this.emit({ type: EventType.WRITE, path });
  }
}
