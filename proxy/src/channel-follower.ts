import type { Redis } from "ioredis";
import type { Logger } from "./log.js";

export interface ChannelHandlers {
  readonly message: (message: string) => void;
  /** false while the subscription is down (events sent meanwhile are lost), true once it is back. */
  readonly live: (live: boolean) => void;
}

/**
 * Follows one pub/sub channel on a subscriber connection (the proxy shares one among its channels) and reports when
 * its events can be trusted: a cache fed by a channel may serve entries only while the channel is live.
 */
export class ChannelFollower {
  private subscribed = false;
  private closed = false;

  constructor(
    private readonly subscriber: Redis,
    private readonly channel: string,
    private readonly handlers: ChannelHandlers,
    private readonly log: Logger,
    /** Names the channel in logs ("route events"). */
    private readonly what: string,
  ) {}

  async start(): Promise<void> {
    this.subscriber.on("message", (channel: string, message: string) => {
      if (channel === this.channel && !this.closed) this.handlers.message(message);
    });
    this.subscriber.on("close", () => {
      if (this.subscribed && !this.closed) this.log.warn(`${this.what} subscription lost; cache off until it is back`);
      this.subscribed = false;
      this.handlers.live(false);
    });
    this.subscriber.on("ready", () => {
      if (!this.subscribed && !this.closed) void this.subscribe().catch(() => undefined);
    });
    await this.subscribe();
  }

  close(): void {
    this.closed = true;
    this.handlers.live(false);
  }

  private async subscribe(): Promise<void> {
    await this.subscriber.subscribe(this.channel);
    if (this.closed) return;
    this.subscribed = true;
    this.handlers.live(true);
  }
}
