import { type Db, withTransaction } from "./db.js";

/**
 * The template builds' slots on nodes, shared by every master: a build sandbox holds one of its node's
 * `maxPerNode` slots while it exists, and a build that finds every node it may use full waits its turn, oldest
 * first, across masters. Rows of `template_builds` (migration 12); only builds still `building` count, so a build
 * failed as abandoned (its master died) gives its slot back with it.
 */

/** Serialises the claims of every master: one look at the counts and the queue, one decision. */
const SLOTS_LOCK = 0x534c_4f54; // "SLOT"

export type SlotClaim =
  | { readonly nodeId: string }
  | {
      /** Builds waiting ahead of this one (older, on any master). */
      readonly queuedAhead: number;
      /** True the first time this build is queued. */
      readonly newlyQueued: boolean;
    };

/**
 * Takes a slot on the first of `ranked` (node ids, best first) with one free that no older waiting build could use;
 * otherwise records the build as waiting (since its first try) for any of them.
 */
export async function claimBuildSlot(
  db: Db,
  buildId: string,
  ranked: readonly string[],
  maxPerNode: number,
): Promise<SlotClaim> {
  return withTransaction(db, async (client) => {
    await client.query("SELECT pg_advisory_xact_lock($1)", [SLOTS_LOCK]);
    const held = await client.query<{ node: string; n: string }>(
      `SELECT slot_node_id AS node, count(*) AS n FROM template_builds
       WHERE status = 'building' AND slot_node_id IS NOT NULL GROUP BY slot_node_id`,
    );
    const busy = new Map(held.rows.map((row) => [row.node, Number(row.n)]));
    const self = await client.query<{ since: Date | null }>(
      "SELECT slot_waiting_since AS since FROM template_builds WHERE id = $1",
      [buildId],
    );
    const since = self.rows[0]?.since ?? null;
    // Older: waiting longer than this build (or at all, when this one has not waited yet); ties by id.
    const older = await client.query<{ candidates: string[] | null }>(
      `SELECT slot_candidates AS candidates FROM template_builds
       WHERE status = 'building' AND slot_node_id IS NULL AND slot_waiting_since IS NOT NULL AND id <> $1
         AND ($2::timestamptz IS NULL OR (slot_waiting_since, id) < ($2::timestamptz, $1::uuid))`,
      [buildId, since],
    );
    const wanted = new Set(older.rows.flatMap((row) => row.candidates ?? []));
    const nodeId = ranked.find((id) => (busy.get(id) ?? 0) < maxPerNode && !wanted.has(id));
    if (nodeId) {
      await client.query(
        `UPDATE template_builds SET slot_node_id = $2, slot_waiting_since = NULL, slot_candidates = NULL
         WHERE id = $1`,
        [buildId, nodeId],
      );
      return { nodeId };
    }
    await client.query(
      `UPDATE template_builds SET slot_waiting_since = coalesce(slot_waiting_since, clock_timestamp()),
         slot_candidates = $2 WHERE id = $1`,
      [buildId, ranked],
    );
    return { queuedAhead: older.rowCount ?? 0, newlyQueued: since === null };
  });
}

/** The build gives its slot back (its sandbox is gone) or leaves the queue (deadline, cancel, failure). */
export async function releaseBuildSlot(db: Db, buildId: string): Promise<void> {
  await db.query(
    `UPDATE template_builds SET slot_node_id = NULL, slot_waiting_since = NULL, slot_candidates = NULL
     WHERE id = $1`,
    [buildId],
  );
}
