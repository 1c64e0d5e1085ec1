import pg from "pg";

export type Db = pg.Pool;
export type DbClient = pg.PoolClient;
export type Queryable = Pick<pg.Pool, "query">;

export interface DbOptions {
  readonly url: string;
  /** PostgreSQL schema holding Warren's tables (tests use one per file). */
  readonly schema: string;
  readonly max?: number;
  /**
   * `off` lets COMMIT return before the WAL is flushed: no corruption, but a PostgreSQL crash may lose the
   * last fraction of a second of commits. Row locks are then held for microseconds instead of an fsync,
   * which is what lets concurrent creates and the ledger's commit-order lock scale.
   */
  readonly synchronousCommit?: "on" | "off";
}

const SCHEMA_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

export function assertSchemaName(schema: string): string {
  if (!SCHEMA_NAME.test(schema)) throw new Error(`invalid PostgreSQL schema name '${schema}'`);
  return schema;
}

/** A pool whose connections resolve unqualified table names in `schema`. */
export function createDb(options: DbOptions): Db {
  const schema = assertSchemaName(options.schema);
  const pool = new pg.Pool({
    connectionString: options.url,
    max: options.max ?? 10,
    options: `-c search_path=${schema} -c synchronous_commit=${options.synchronousCommit ?? "on"}`,
    connectionTimeoutMillis: 5_000,
  });
  // An idle client that loses its server (PostgreSQL restart) must not crash the process.
  pool.on("error", () => undefined);
  return pool;
}

/** How long a statement of the transaction waits for a row lock before it fails (PostgreSQL's `lock_timeout`). */
export interface TransactionOptions {
  readonly lockTimeoutMs?: number;
  /**
   * Takes this transaction-scoped advisory lock (`pg_advisory_xact_lock(hashtext(key))`) in the round trip that
   * begins the transaction, before `fn` runs.
   */
  readonly advisoryLock?: string;
}

export async function withTransaction<T>(
  db: Db,
  fn: (client: DbClient) => Promise<T>,
  options: TransactionOptions = {},
): Promise<T> {
  const client = await db.connect();
  // A checked-out client has no listener of the pool's: a server that goes away (a PostgreSQL restart) while the
  // transaction awaits other work (a node agent's answer) would emit an unhandled 'error' and end the process. The
  // error is kept instead (the transaction's next query fails with it) and the client destroyed, not reused.
  let broken: Error | undefined;
  const onError = (error: Error) => {
    broken = error;
  };
  client.on("error", onError);
  try {
    // One round trip: the simple query protocol takes both statements at once (every sandbox transition starts so).
    const lockTimeout = options.lockTimeoutMs;
    if (lockTimeout !== undefined && !(Number.isInteger(lockTimeout) && lockTimeout >= 0)) {
      throw new Error(`lock timeout must be whole milliseconds, got ${lockTimeout}`);
    }
    const statements = ["BEGIN"];
    if (lockTimeout !== undefined) statements.push(`SET LOCAL lock_timeout = ${lockTimeout}`);
    // The simple protocol takes no parameters: the key goes in as a literal, escaped by the driver.
    if (options.advisoryLock !== undefined) {
      statements.push(`SELECT pg_advisory_xact_lock(hashtext(${client.escapeLiteral(options.advisoryLock)}))`);
    }
    await client.query(statements.join("; "));
    const result = await fn(client);
    await client.query("COMMIT");
    return result;
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw error;
  } finally {
    client.off("error", onError);
    client.release(broken);
  }
}
