import { effectiveEgress } from "../runtime/egress/policy.js";
import { type Db, type DbClient, withTransaction } from "../store/db.js";
import { appendEventParams, appendEventSql } from "../store/events.js";
import { type SandboxRow, toSandboxRow } from "../store/sandboxes.js";
import type { Team } from "../store/teams.js";
import { MasterError } from "./errors.js";
import type { CreateInput } from "./sandbox-creation.js";
import { newSandboxId, sha256Hex, type TokenIssuer } from "./tokens.js";

/** What the admitted row copies from the template and the request. */
export interface AdmissionTemplate {
  readonly templateId: string;
  readonly alias: string | null;
  readonly cpuCount: number;
  readonly memoryMB: number;
  readonly diskSizeMB: number;
  readonly envdVersion: string;
  readonly timeout: number;
  readonly publicTraffic: boolean;
  /** The first-choice node, so its reservation counts from the start. */
  readonly nodeId: string | null;
  /** A team's custom template (templateId is then the node template it runs on) and its build. */
  readonly sourceTemplateId?: string;
  readonly buildId?: string;
}

/**
 * Quota, rate limit and idempotency checks plus the `starting` row and its ledger event, in one transaction
 * serialized per team (a transaction-scoped advisory lock, taken as the transaction begins), so two concurrent
 * creates can never both take the last slot or both miss an Idempotency-Key.
 */
export function admitSandbox(
  db: Db,
  tokens: TokenIssuer,
  team: Team,
  input: CreateInput,
  t: AdmissionTemplate,
): Promise<{ row: SandboxRow; replayed: boolean }> {
  return withTransaction(db, (tx) => admitLocked(tx, tokens, team, input, t), { advisoryLock: `team:${team.id}` });
}

async function admitLocked(
  tx: DbClient,
  tokens: TokenIssuer,
  team: Team,
  input: CreateInput,
  t: AdmissionTemplate,
): Promise<{ row: SandboxRow; replayed: boolean }> {
  if (input.idempotencyKey) {
    await tx.query(
      `UPDATE sandboxes SET idempotency_key = NULL
       WHERE team_id = $1 AND idempotency_key = $2 AND created_at <= now() - interval '24 hours'`,
      [team.id, input.idempotencyKey],
    );
    const existing = await tx.query("SELECT * FROM sandboxes WHERE team_id = $1 AND idempotency_key = $2", [
      team.id,
      input.idempotencyKey,
    ]);
    if (existing.rows[0]) {
      const row = toSandboxRow(existing.rows[0]);
      if (row.requestHash !== (input.requestHash ?? null)) {
        throw new MasterError("invalid", `Idempotency-Key '${input.idempotencyKey}' was used with another request`);
      }
      return { row, replayed: true };
    }
  }
  // Both counts in one round trip (after the team's lock: a statement sees what committed before it began).
  const counts = await tx.query<{ live: string; recent: string; wait: string | null }>(
    `SELECT
       (SELECT count(*) FROM sandboxes
        WHERE team_id = $1 AND state IN ('starting','running','pausing','resuming')) AS live,
       recent.n AS recent, recent.wait
     FROM (SELECT count(*) AS n, ceil(extract(epoch FROM min(created_at) + interval '1 minute' - now())) AS wait
           FROM sandboxes WHERE team_id = $1 AND created_at > now() - interval '1 minute') AS recent`,
    [team.id],
  );
  const count = counts.rows[0];
  if (Number(count?.live) >= team.maxConcurrentSandboxes) {
    throw new MasterError(
      "quota",
      `You have reached the maximum number of concurrent sandboxes (${team.maxConcurrentSandboxes})`,
      5,
    );
  }
  if (Number(count?.recent) >= team.maxCreatesPerMinute) {
    const wait = Math.max(1, Number(count?.wait ?? 1));
    throw new MasterError("quota", `Create rate limit of ${team.maxCreatesPerMinute} per minute reached`, wait);
  }
  const id = newSandboxId();
  const nonce = tokens.newNonce();
  const now = new Date();
  // The row and its ledger event in one statement (the event last before COMMIT, as the ledger needs).
  const event = appendEventParams({
    sandboxId: id,
    teamId: team.id,
    type: "sandbox.created",
    toState: "starting",
    data: {
      templateId: t.sourceTemplateId ?? t.templateId,
      ...(t.buildId ? { buildId: t.buildId } : {}),
      timeoutSeconds: t.timeout,
      metadata: input.metadata,
    },
  });
  const result = await tx.query(
    `WITH inserted AS (
       INSERT INTO sandboxes (id, team_id, template_id, alias, state, cpu_count, memory_mb, disk_size_mb,
         envd_version, token_nonce, envd_token_hash, traffic_token_hash, metadata, env_vars, network,
         allow_internet_access, volume_mounts, auto_pause, auto_pause_memory, auto_resume, idempotency_key,
         request_hash, created_at, started_at, end_at, node_id, egress, source_template_id, build_id, mcp_servers)
       VALUES ($1,$2,$3,$4,'starting',$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$22,$23,$24,
         $25,$26,$27,$28)
       RETURNING *
     ), event AS (${appendEventSql(29)})
     SELECT * FROM inserted`,
    [
      id,
      team.id,
      t.templateId,
      t.alias,
      t.cpuCount,
      t.memoryMB,
      t.diskSizeMB,
      t.envdVersion,
      nonce,
      sha256Hex(tokens.envdToken(id, nonce)),
      t.publicTraffic ? null : sha256Hex(tokens.trafficToken(id, nonce)),
      JSON.stringify(input.metadata),
      JSON.stringify(input.envVars),
      input.network ? JSON.stringify(input.network) : null,
      input.allowInternetAccess,
      JSON.stringify(input.volumeMounts),
      input.autoPause,
      input.autoPauseMemory,
      input.autoResume,
      input.idempotencyKey ?? null,
      input.requestHash ?? null,
      now,
      new Date(now.getTime() + t.timeout * 1000),
      t.nodeId,
      JSON.stringify(effectiveEgress(input.network, input.allowInternetAccess, team.egressMode)),
      t.sourceTemplateId ?? null,
      t.buildId ?? null,
      JSON.stringify(input.mcpServers ?? []),
      ...event,
    ],
  );
  const row = toSandboxRow(result.rows[0]);
  return { row, replayed: false };
}
