import pg from "pg";
import type { Logger } from "./log.js";

const LEADER_LOCK = 0x4c45_4144; // "LEAD"

export interface LeaderOptions {
  readonly url: string;
  readonly schema: string;
  /** How often a standby retries the lock, and the leader checks its session is alive. */
  readonly intervalMs: number;
  readonly onElected: () => void;
  readonly onDemoted: () => void;
  readonly log: Logger;
}

/**
 * How a master replica learns it leads: the PostgreSQL lock below, or a Kubernetes Lease
 * (`kubernetes/lease-election.ts`). Either calls onElected / onDemoted; at most one replica leads at a time.
 */
export interface Leadership {
  readonly isLeader: boolean;
  start(): void;
  /** Steps down (onDemoted) and gives the leadership up at once, so a standby takes over on its next try. */
  stop(): Promise<void>;
}

/**
 * Leader election with a PostgreSQL session-level advisory lock: whoever holds it is leader. If the leader's
 * process or connection dies, PostgreSQL releases the lock and a standby's next try wins.
 */
export class LeaderElection implements Leadership {
  private client: pg.Client | undefined;
  private timer: NodeJS.Timeout | undefined;
  private leading = false;
  private stopped = false;

  constructor(private readonly options: LeaderOptions) {}

  get isLeader(): boolean {
    return this.leading;
  }

  start(): void {
    void this.tick();
  }

  private schedule(): void {
    if (!this.stopped) this.timer = setTimeout(() => void this.tick(), this.options.intervalMs);
  }

  private async tick(): Promise<void> {
    try {
      if (!this.client) {
        const client = new pg.Client({ connectionString: this.options.url });
        client.on("error", () => this.lose("leader connection lost"));
        await client.connect();
        this.client = client;
      }
      if (this.leading) {
        await this.client.query("SELECT 1");
      } else {
        const result = await this.client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock($1, hashtext($2)) AS ok", [
          LEADER_LOCK,
          this.options.schema,
        ]);
        if (result.rows[0]?.ok && !this.stopped) {
          this.leading = true;
          this.options.log.info("elected leader");
          this.options.onElected();
        }
      }
    } catch (error) {
      this.lose(`leader check failed: ${String(error)}`);
    }
    this.schedule();
  }

  private lose(reason: string): void {
    const client = this.client;
    this.client = undefined;
    client?.end().catch(() => undefined);
    if (this.leading) {
      this.leading = false;
      this.options.log.warn("lost leadership", { reason });
      this.options.onDemoted();
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    const client = this.client;
    this.client = undefined;
    if (this.leading) {
      this.leading = false;
      this.options.onDemoted();
    }
    // Ending the session releases the lock at once, so a standby takes over on its next try.
    await client?.end().catch(() => undefined);
  }
}
