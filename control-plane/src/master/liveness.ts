import pg from "pg";
import { MASTER_LIVENESS_CLASS, newLivenessKey, TRY_LIVENESS_LOCK_SQL } from "../store/master-liveness.js";
import type { Logger } from "./log.js";

export interface LivenessOptions {
  readonly url: string;
  /** How often a lost lock is taken again. */
  readonly retryMs: number;
  readonly log: Logger;
}

/**
 * This master's liveness lock (store/master-liveness.ts), held on a connection of its own while the master runs, so
 * the builds it claims are continued by another master as soon as it dies. Losing the connection loses the lock
 * for a moment (another master may then take its builds over: their runs here notice and stop); it is taken again
 * with the same key.
 */
export class MasterLiveness {
  readonly key = newLivenessKey();
  private client: pg.Client | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(private readonly options: LivenessOptions) {}

  /** Resolves once the lock is held (the master claims no build before). */
  async start(): Promise<void> {
    await this.acquire();
  }

  private async acquire(): Promise<void> {
    const client = new pg.Client({ connectionString: this.options.url });
    client.on("error", () => this.lost());
    await client.connect();
    try {
      const result = await client.query<{ ok: boolean }>(TRY_LIVENESS_LOCK_SQL, [MASTER_LIVENESS_CLASS, this.key]);
      if (!result.rows[0]?.ok) throw new Error(`the liveness lock ${this.key} is held by another session`);
    } catch (error) {
      await client.end().catch(() => undefined);
      throw error;
    }
    if (this.stopped) {
      await client.end().catch(() => undefined);
      return;
    }
    this.client = client;
  }

  private lost(): void {
    const client = this.client;
    this.client = undefined;
    client?.end().catch(() => undefined);
    if (this.stopped || this.timer) return;
    this.options.log.warn("liveness lock lost with its connection; taking it again");
    const retry = () => {
      this.timer = undefined;
      if (this.stopped || this.client) return;
      this.acquire().catch((error: unknown) => {
        this.options.log.warn("liveness lock not taken yet", { error: String(error) });
        this.timer = setTimeout(retry, this.options.retryMs);
      });
    };
    this.timer = setTimeout(retry, this.options.retryMs);
  }

  /** Releases the lock (after the master handed its builds over). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }
}
