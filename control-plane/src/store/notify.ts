import pg from "pg";
import { assertSchemaName, type Queryable } from "./db.js";

/**
 * Nudges between master replicas through PostgreSQL's LISTEN/NOTIFY: a notification is sent when its transaction
 * commits (never for one that rolls back), and every deployment sharing a database has channels of its own (the
 * schema is part of the name). A nudge only brings work forward: whoever listens still does the same work on its
 * timer, so a nudge lost while no one listens costs time, never correctness.
 */
export type Topic = "durability" | "identity";

const channel = (topic: Topic, schema: string) => `warren_${topic}_${assertSchemaName(schema)}`;

/** Sends `topic` (with `payload`) when `db`'s transaction commits; at once outside one. */
export async function notify(db: Queryable, topic: Topic, payload = ""): Promise<void> {
  // The connection's schema is the deployment's (search_path, store/db.ts).
  await db.query("SELECT pg_notify('warren_' || $1 || '_' || current_schema(), $2)", [topic, payload]);
}

export interface ListenerOptions {
  readonly url: string;
  readonly schema: string;
  readonly topic: Topic;
  readonly onNotify: (payload: string) => void;
  /** Told each time LISTEN took effect: from then on, every notification of the topic reaches `onNotify`. */
  readonly onListening?: () => void;
  /** Told when the connection fails (it is made again after `retryMs`): notifications until then are lost. */
  readonly onError?: (error: Error) => void;
  readonly retryMs?: number;
}

/** One connection that LISTENs to a topic until stopped, connecting again after a failure. */
export class Listener {
  private client: pg.Client | undefined;
  private retry: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(private readonly options: ListenerOptions) {}

  start(): void {
    this.stopped = false;
    void this.connect();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.retry);
    const client = this.client;
    this.client = undefined;
    await client?.end().catch(() => undefined);
  }

  private async connect(): Promise<void> {
    const { url, schema, topic, onNotify, onListening, onError, retryMs = 1000 } = this.options;
    const client = new pg.Client({ connectionString: url });
    const fail = (error: Error) => {
      if (this.client !== client) return;
      this.client = undefined;
      client.end().catch(() => undefined);
      onError?.(error);
      if (!this.stopped) this.retry = setTimeout(() => void this.connect(), retryMs);
    };
    this.client = client;
    client.on("error", fail);
    client.on("end", () => fail(new Error("the listening connection ended")));
    client.on("notification", (message) => onNotify(message.payload ?? ""));
    try {
      await client.connect();
      await client.query(`LISTEN "${channel(topic, schema)}"`);
      if (this.stopped) await this.stop();
      else if (this.client === client) onListening?.();
    } catch (error) {
      fail(error as Error);
    }
  }
}
