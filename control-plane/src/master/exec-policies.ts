import {
  EXEC_POLICIES_SYNCED_KEY,
  EXEC_POLICY_EVENT_ALL,
  execPolicyEventsChannel,
  execPolicyKey,
} from "@warren/proto/exec-policy";
import type { Redis } from "ioredis";
import { type Db, withTransaction } from "../store/db.js";
import { MasterError } from "./errors.js";
import type { Logger } from "./log.js";

// Serializes every write of the Redis mirror against the rows it mirrors: a sync that read the table before a
// change can never write its stale copy over the change (nor delete a key the change just made).
const MIRROR_LOCK = 0x4558_4543; // "EXEC"

/**
 * Teams' exec policies: PostgreSQL holds them (`teams.exec_policy`), Redis mirrors them for the proxies, which
 * enforce them (proxy/src/exec-gate.ts). The leader re-syncs the whole mirror each pass and then stamps
 * EXEC_POLICIES_SYNCED_KEY: a Redis that lost its data has no stamp, and proxies refuse starts until it is back.
 */
export class ExecPolicies {
  constructor(
    private readonly db: Db,
    private readonly redis: Redis,
    private readonly log: Logger,
  ) {}

  /** Stores and mirrors a team's policy (JSON, already validated by the api); "" clears it. */
  async set(teamId: string, policyJson: string): Promise<void> {
    await withTransaction(this.db, async (tx) => {
      await tx.query("SELECT pg_advisory_xact_lock($1)", [MIRROR_LOCK]);
      const updated = await tx.query("UPDATE teams SET exec_policy = $2::jsonb WHERE id = $1", [
        teamId,
        policyJson === "" ? null : policyJson,
      ]);
      if ((updated.rowCount ?? 0) === 0) throw new MasterError("not_found", `team '${teamId}' not found`);
      // Before COMMIT: when Redis cannot take it, the row rolls back and the caller hears UNAVAILABLE.
      try {
        if (policyJson === "") await this.redis.del(execPolicyKey(teamId));
        else await this.redis.set(execPolicyKey(teamId), policyJson);
        // After the write: proxies drop their copy of this team's policy and read the new one.
        await this.redis.publish(this.channel(), teamId);
      } catch (error) {
        throw new MasterError("unavailable", `exec policy could not be mirrored to Redis: ${(error as Error).message}`);
      }
    });
    this.log.info("exec policy set", { teamId, cleared: policyJson === "" });
  }

  /** The leader's pass: every stored policy into Redis, stale keys out, then the stamp. */
  async syncAll(): Promise<void> {
    await withTransaction(this.db, async (tx) => {
      await tx.query("SELECT pg_advisory_xact_lock($1)", [MIRROR_LOCK]);
      const rows = await tx.query<{ id: string; policy: string }>(
        "SELECT id, exec_policy::text AS policy FROM teams WHERE exec_policy IS NOT NULL",
      );
      const wanted = new Map(rows.rows.map((row) => [execPolicyKey(row.id), row.policy]));
      const prefix = this.redis.options.keyPrefix ?? "";
      // SCAN patterns and the keys it returns carry the prefix; commands add it themselves.
      const present: string[] = [];
      let cursor = "0";
      do {
        const [next, keys] = await this.redis.scan(cursor, "MATCH", `${prefix}${execPolicyKey("*")}`, "COUNT", 500);
        cursor = next;
        for (const key of keys) present.push(key.slice(prefix.length));
      } while (cursor !== "0");
      const wantedKeys = [...wanted.keys()];
      const [stamp, ...current] = await this.redis.mget(EXEC_POLICIES_SYNCED_KEY, ...wantedKeys);
      // Proxies keep policies in memory; they drop every copy only when this pass changes something (usually
      // nothing: a Redis that lost its data, or a write that failed half way), so their copies stay warm.
      const changed =
        !stamp ||
        present.some((key) => !wanted.has(key)) ||
        wantedKeys.some((key, i) => current[i] !== wanted.get(key));
      const pipeline = this.redis.multi();
      for (const key of present) if (!wanted.has(key)) pipeline.del(key);
      for (const [key, policy] of wanted) pipeline.set(key, policy);
      pipeline.set(EXEC_POLICIES_SYNCED_KEY, new Date().toISOString());
      if (changed) pipeline.publish(this.channel(), EXEC_POLICY_EVENT_ALL);
      await pipeline.exec();
    });
  }

  private channel(): string {
    return execPolicyEventsChannel(this.redis.options.keyPrefix ?? "");
  }
}
