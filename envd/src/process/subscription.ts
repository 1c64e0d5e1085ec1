import type { EnvdError } from "../errors.js";
import type { ProcessExit } from "./exit-status.js";
import type { OutputChunk } from "./output-buffer.js";

/** What a stream still has to send: output, then the end of the process or of envd. */
export type StreamItem =
  | { readonly kind: "data"; readonly chunk: OutputChunk }
  | { readonly kind: "end"; readonly exit: ProcessExit }
  | { readonly kind: "failed"; readonly error: EnvdError };

/** The process side of a subscription: told when a backlog shrinks and when a stream goes away. */
export interface SubscriptionOwner {
  drained(subscription: Subscription): void;
  release(subscription: Subscription): void;
}

/** Below this many queued bytes a subscription that held its process back lets it go on. */
export const RESUME_BELOW_BYTES = 256 * 1024;

/**
 * One stream's view of a process: the items it has not sent yet, in order. The process
 * pushes; the stream's handler takes. A subscription is closed when its stream ends.
 */
export class Subscription {
  // Taken items are cleared so the queue does not pin their bytes.
  private queue: Array<StreamItem | undefined> = [];
  private head = 0;
  private queuedBytes = 0;
  private wake: (() => void) | undefined;
  private closed = false;

  constructor(
    /** Offset of the first output byte this subscription delivers. */
    readonly firstOffset: number,
    private readonly owner: SubscriptionOwner,
  ) {}

  /** Bytes of output queued and not yet taken. */
  get backlogBytes(): number {
    return this.queuedBytes;
  }

  push(item: StreamItem): void {
    if (this.closed) return;
    this.queue.push(item);
    if (item.kind === "data") this.queuedBytes += item.chunk.data.length;
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  take(): StreamItem | undefined {
    const item = this.queue[this.head];
    if (item === undefined) return undefined;
    this.queue[this.head] = undefined;
    this.head++;
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    }
    if (item.kind === "data") {
      const before = this.queuedBytes;
      this.queuedBytes -= item.chunk.data.length;
      if (before > RESUME_BELOW_BYTES && this.queuedBytes <= RESUME_BELOW_BYTES) this.owner.drained(this);
    }
    return item;
  }

  /** Resolves once an item is waiting (at once if one already is). */
  whenReady(): Promise<void> {
    if (this.head < this.queue.length || this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.wake = resolve;
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.queue = [];
    this.head = 0;
    this.queuedBytes = 0;
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
    this.owner.release(this);
  }
}
