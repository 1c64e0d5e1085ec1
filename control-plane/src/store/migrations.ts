import type { Db } from "./db.js";
import { assertSchemaName, withTransaction } from "./db.js";

/**
 * Versioned schema migrations. A migration is never edited once released: add a new version instead.
 * They run in one transaction each, under an advisory lock, so concurrent starters apply each exactly once.
 */
export const MIGRATIONS: readonly { readonly version: number; readonly name: string; readonly sql: string }[] = [
  {
    version: 1,
    name: "teams, api keys, templates, nodes, sandboxes, sandbox_events",
    sql: `
CREATE TABLE teams (
  id text PRIMARY KEY,
  name text NOT NULL,
  max_concurrent_sandboxes integer NOT NULL DEFAULT 100,
  max_length_hours integer NOT NULL DEFAULT 24,
  max_creates_per_minute integer NOT NULL DEFAULT 600,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE api_keys (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  key_hash text NOT NULL UNIQUE,
  key_prefix text NOT NULL,
  name text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT now(),
  last_used_at timestamptz,
  revoked_at timestamptz
);
-- Resources match the node agent's template recipes (control-plane/src/templates/catalog.ts).
CREATE TABLE templates (
  id text PRIMARY KEY,
  alias text UNIQUE,
  cpu_count integer NOT NULL,
  memory_mb integer NOT NULL,
  disk_size_mb integer NOT NULL,
  envd_version text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO templates (id, alias, cpu_count, memory_mb, disk_size_mb, envd_version) VALUES
  ('base', 'base', 1, 512, 1024, '0.6.4'),
  ('code-interpreter-v1', 'code-interpreter-v1', 2, 1024, 2048, '0.6.4');
CREATE TABLE nodes (
  id text PRIMARY KEY,
  addr text NOT NULL,
  state text NOT NULL CHECK (state IN ('up', 'down')),
  last_seen_at timestamptz NOT NULL,
  changed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE sandboxes (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id),
  template_id text NOT NULL,
  alias text,
  state text NOT NULL CHECK (state IN ('starting','running','pausing','paused','resuming','killed','failed')),
  node_id text,
  exec_id text,
  cpu_count integer NOT NULL,
  memory_mb integer NOT NULL,
  disk_size_mb integer NOT NULL,
  envd_version text NOT NULL,
  token_nonce text NOT NULL,
  envd_token_hash text NOT NULL,
  traffic_token_hash text,
  metadata jsonb NOT NULL DEFAULT '{}',
  env_vars jsonb NOT NULL DEFAULT '{}',
  network jsonb,
  allow_internet_access boolean,
  volume_mounts jsonb NOT NULL DEFAULT '[]',
  auto_pause boolean NOT NULL DEFAULT false,
  auto_pause_memory boolean NOT NULL DEFAULT true,
  auto_resume boolean NOT NULL DEFAULT false,
  idempotency_key text,
  request_hash text,
  created_at timestamptz NOT NULL DEFAULT now(),
  started_at timestamptz NOT NULL DEFAULT now(),
  end_at timestamptz NOT NULL,
  paused_at timestamptz,
  ended_at timestamptz,
  end_reason text
);
CREATE UNIQUE INDEX sandboxes_idempotency ON sandboxes (team_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX sandboxes_team_live ON sandboxes (team_id, started_at) WHERE state NOT IN ('killed', 'failed');
CREATE INDEX sandboxes_team_created ON sandboxes (team_id, created_at);
CREATE INDEX sandboxes_expiry ON sandboxes (end_at) WHERE state = 'running';
CREATE INDEX sandboxes_node ON sandboxes (node_id) WHERE state NOT IN ('killed', 'failed');
CREATE TABLE sandbox_events (
  id bigserial PRIMARY KEY,
  sandbox_id text NOT NULL,
  team_id text NOT NULL,
  type text NOT NULL,
  from_state text,
  to_state text,
  data jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sandbox_events_team ON sandbox_events (team_id, id);
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, id);
CREATE RULE sandbox_events_no_update AS ON UPDATE TO sandbox_events DO INSTEAD NOTHING;
CREATE RULE sandbox_events_no_delete AS ON DELETE TO sandbox_events DO INSTEAD NOTHING;
`,
  },
  {
    version: 2,
    name: "egress policy: team egress mode, each sandbox's effective policy",
    sql: `
ALTER TABLE teams ADD COLUMN egress_mode text NOT NULL DEFAULT 'open'
  CHECK (egress_mode IN ('open', 'closed', 'forbidden'));
ALTER TABLE sandboxes ADD COLUMN egress jsonb;
`,
  },
  {
    version: 3,
    name: "sandbox_metrics: each sandbox's resource use over time",
    sql: `
CREATE TABLE sandbox_metrics (
  sandbox_id text NOT NULL,
  team_id text NOT NULL,
  ts timestamptz NOT NULL,
  cpu_count integer NOT NULL,
  cpu_used_pct real NOT NULL,
  mem_used bigint NOT NULL,
  mem_total bigint NOT NULL,
  disk_used bigint NOT NULL,
  disk_total bigint NOT NULL,
  PRIMARY KEY (sandbox_id, ts)
);
CREATE INDEX sandbox_metrics_ts ON sandbox_metrics (ts);
`,
  },
  {
    version: 4,
    name: "snapshots: sandbox snapshots (createSnapshot, fork) kept on a node",
    sql: `
CREATE TABLE snapshots (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id),
  -- Unique per team among live snapshots; a new snapshot with a taken name takes it over.
  name text,
  -- 'snapshot': createSnapshot (listed, kept until deleted); 'fork': a fork's source (hidden, deleted after).
  kind text NOT NULL CHECK (kind IN ('snapshot', 'fork')),
  source_sandbox_id text NOT NULL,
  node_id text NOT NULL,
  template_id text NOT NULL,
  driver text NOT NULL,
  memory boolean NOT NULL,
  size_bytes bigint NOT NULL,
  cpu_count integer NOT NULL,
  memory_mb integer NOT NULL,
  disk_size_mb integer NOT NULL,
  env_vars jsonb NOT NULL DEFAULT '{}',
  metadata jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now(),
  deleted_at timestamptz
);
CREATE UNIQUE INDEX snapshots_team_name ON snapshots (team_id, name) WHERE deleted_at IS NULL AND name IS NOT NULL;
CREATE INDEX snapshots_team_created ON snapshots (team_id, created_at DESC, id DESC) WHERE deleted_at IS NULL;
-- An operator's cordon (admin API): the node takes no new sandboxes and paused ones resume elsewhere.
ALTER TABLE nodes ADD COLUMN cordoned_at timestamptz;
`,
  },
  {
    version: 5,
    name: "templates: base-vm (base in a microVM only: its recipe requires the microvm driver)",
    sql: `
INSERT INTO templates (id, alias, cpu_count, memory_mb, disk_size_mb, envd_version)
  VALUES ('base-vm', 'base-vm', 1, 512, 1024, '0.6.4') ON CONFLICT (id) DO NOTHING;
`,
  },
  {
    version: 6,
    name: "custom templates: team templates, builds with logs, tags, uploaded files, cached step layers",
    sql: `
-- team_id NULL: shipped with Warren (public to every team, the null namespace). Aliases are unique per namespace.
ALTER TABLE templates DROP CONSTRAINT IF EXISTS templates_alias_key;
ALTER TABLE templates ADD COLUMN team_id text REFERENCES teams(id);
ALTER TABLE templates ADD COLUMN public boolean NOT NULL DEFAULT false;
ALTER TABLE templates ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE templates ADD COLUMN deleted_at timestamptz;
ALTER TABLE templates ADD COLUMN spawn_count bigint NOT NULL DEFAULT 0;
ALTER TABLE templates ADD COLUMN last_spawned_at timestamptz;
UPDATE templates SET public = true WHERE team_id IS NULL;
CREATE UNIQUE INDEX templates_alias_shipped ON templates (alias) WHERE team_id IS NULL AND deleted_at IS NULL;
CREATE UNIQUE INDEX templates_alias_team ON templates (team_id, alias) WHERE team_id IS NOT NULL AND deleted_at IS NULL;
CREATE TABLE template_builds (
  id uuid PRIMARY KEY,
  template_id text NOT NULL REFERENCES templates(id),
  team_id text NOT NULL REFERENCES teams(id),
  status text NOT NULL CHECK (status IN ('waiting', 'building', 'ready', 'error')),
  reason jsonb,
  cpu_count integer NOT NULL,
  memory_mb integer NOT NULL,
  disk_size_mb integer NOT NULL,
  envd_version text NOT NULL,
  -- The trigger's body (E2B TemplateBuildStartV2), stored before the master runs it.
  spec jsonb,
  -- The result: the node holding the ready snapshot, the snapshot, the node template under it, and what
  -- sandboxes from it start with.
  node_id text,
  snapshot_id text,
  layer_snapshot_id text,
  base_template_id text,
  start_cmd text,
  ready_cmd text,
  default_user text,
  default_workdir text,
  env_vars jsonb NOT NULL DEFAULT '{}',
  layer_keys text[] NOT NULL DEFAULT '{}',
  build_sandbox_id text,
  token_nonce text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);
CREATE INDEX template_builds_template ON template_builds (template_id, created_at DESC);
CREATE TABLE template_build_logs (
  build_id uuid NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
  seq integer NOT NULL,
  ts timestamptz NOT NULL DEFAULT now(),
  level text NOT NULL,
  message text NOT NULL,
  step text,
  PRIMARY KEY (build_id, seq)
);
-- Append-only history: name:tag resolves to the newest assignment whose build is ready.
CREATE TABLE template_tags (
  id bigserial PRIMARY KEY,
  template_id text NOT NULL REFERENCES templates(id),
  tag text NOT NULL,
  build_id uuid NOT NULL REFERENCES template_builds(id),
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX template_tags_lookup ON template_tags (template_id, tag, id DESC);
-- COPY archives, per team under the SDK's filesHash.
CREATE TABLE template_files (
  team_id text NOT NULL REFERENCES teams(id),
  hash text NOT NULL,
  size_bytes bigint NOT NULL,
  data bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (team_id, hash)
);
-- One-time upload links the files handshake hands out (the SDK's PUT carries no API key): the token's hash.
CREATE TABLE template_upload_links (
  token_hash text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id),
  hash text NOT NULL,
  expires_at timestamptz NOT NULL
);
-- Step layers by E2B's key chain (previous key, step, files hash): the files-only snapshot after that step and the
-- build context (user, workdir, env) there.
CREATE TABLE template_layers (
  team_id text NOT NULL REFERENCES teams(id),
  key text NOT NULL,
  snapshot_id text NOT NULL,
  node_id text NOT NULL,
  context jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (team_id, key)
);
ALTER TABLE snapshots DROP CONSTRAINT IF EXISTS snapshots_kind_check;
ALTER TABLE snapshots ADD CONSTRAINT snapshots_kind_check CHECK (kind IN ('snapshot', 'fork', 'template', 'layer'));
-- A snapshot published to the cluster's store (a built template): the digest its pulls are checked against, and
-- the nodes that hold a copy besides the one that made it.
ALTER TABLE snapshots ADD COLUMN digest text;
CREATE TABLE snapshot_copies (
  snapshot_id text NOT NULL REFERENCES snapshots(id),
  node_id text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (snapshot_id, node_id)
);
-- A sandbox of a custom template: the template (template_id stays the node template it runs on) and its build.
ALTER TABLE sandboxes ADD COLUMN source_template_id text;
ALTER TABLE sandboxes ADD COLUMN build_id uuid;
`,
  },
  {
    version: 7,
    name: "secrets (sealed with WARREN_SECRETS_KEYS) and one-time secret grants",
    sql: `
-- A team's secrets: only the current version's value is kept, sealed (AES-256-GCM) with the key named by key_id.
CREATE TABLE secrets (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name text NOT NULL,
  metadata jsonb NOT NULL DEFAULT '{}',
  current_version integer NOT NULL DEFAULT 1,
  key_id text NOT NULL,
  ciphertext bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);
CREATE INDEX secrets_team_created ON secrets (team_id, created_at DESC, id DESC);
-- A grant lets one process start in one sandbox have these secrets (env: env var name -> secret id); only the
-- grant's hash is stored, and it is used up by its first redemption.
CREATE TABLE secret_grants (
  grant_hash text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  sandbox_id text NOT NULL,
  env jsonb NOT NULL,
  expires_at timestamptz NOT NULL,
  used_at timestamptz
);
`,
  },
  {
    version: 8,
    name: "volumes and their content API's tokens; durable pauses (a paused sandbox's snapshot in the store)",
    sql: `
-- E2B volumes. The data lives in WARREN_VOLUMES_DIR/<team>/<id> (a filesystem every node and the api share);
-- deleting a volume removes the row at once (its name is free again) and the data right after.
CREATE TABLE volumes (
  id uuid PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  name text NOT NULL,
  quota_bytes bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (team_id, name)
);
-- A content API token names one volume of one team; only its hash is stored.
CREATE TABLE volume_tokens (
  token_hash text PRIMARY KEY,
  volume_id uuid NOT NULL REFERENCES volumes(id) ON DELETE CASCADE,
  team_id text NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX volume_tokens_expiry ON volume_tokens (expires_at);
-- A paused sandbox is durable once a snapshot of it is published to the cluster's store: its node may then go.
-- The snapshot is of kind 'durable' (never listed; the last one is offered when a running sandbox is lost).
ALTER TABLE sandboxes ADD COLUMN durable_snapshot_id text;
ALTER TABLE snapshots DROP CONSTRAINT IF EXISTS snapshots_kind_check;
ALTER TABLE snapshots ADD CONSTRAINT snapshots_kind_check
  CHECK (kind IN ('snapshot', 'fork', 'template', 'layer', 'durable'));
`,
  },
  {
    version: 9,
    name: "sandboxes: the MCP servers a create asked for (names only; their configs carry credentials)",
    sql: `
ALTER TABLE sandboxes ADD COLUMN mcp_servers jsonb NOT NULL DEFAULT '[]';
`,
  },
  {
    version: 10,
    name: "artifacts: files and folders published out of sandboxes (the bytes in WARREN_ARTIFACTS_DIR by digest)",
    sql: `
-- An artifact outlives its sandbox (no foreign key to sandboxes); its bytes are the blob <dir>/sha256/<sha256>,
-- shared by every artifact with the same content and removed with the last of them.
CREATE TABLE artifacts (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  sandbox_id text NOT NULL,
  path text NOT NULL,
  format text NOT NULL CHECK (format IN ('tar', 'zip')),
  size_bytes bigint NOT NULL,
  sha256 text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX artifacts_team ON artifacts (team_id, created_at, id);
CREATE INDEX artifacts_sandbox ON artifacts (team_id, sandbox_id, created_at);
CREATE INDEX artifacts_digest ON artifacts (sha256);
`,
  },
  {
    version: 11,
    name: "exec policies (a team's rules for envd starts and file writes), their reviews, approver API keys",
    sql: `
-- The team's exec policy (JSON of @warren/proto/exec-policy ExecPolicy); NULL: none (E2B's behaviour). The master
-- mirrors it into Redis for the proxies, which enforce it.
ALTER TABLE teams ADD COLUMN exec_policy jsonb;
-- A key that may change the exec policy and approve or reject reviews.
ALTER TABLE api_keys ADD COLUMN approver boolean NOT NULL DEFAULT false;
-- A request a 'review' rule held back. Approved, it may be used once, by the same request (same digest) in the
-- same sandbox, before expires_at; a pending one past expires_at is expired.
CREATE TABLE exec_approvals (
  id text PRIMARY KEY,
  team_id text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
  sandbox_id text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('start', 'write', 'remove')),
  request jsonb NOT NULL,
  digest text NOT NULL,
  rule text NOT NULL,
  state text NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'used')),
  requested_at timestamptz NOT NULL DEFAULT now(),
  expires_at timestamptz NOT NULL,
  decided_by text,
  decided_at timestamptz,
  reason text,
  used_at timestamptz
);
CREATE INDEX exec_approvals_team ON exec_approvals (team_id, requested_at DESC, id DESC);
CREATE INDEX exec_approvals_pending ON exec_approvals (sandbox_id, digest) WHERE state = 'pending';
`,
  },
  {
    version: 12,
    name: "build slots: which node a running build holds a slot on, and the builds waiting for one (every master's)",
    sql: `
-- The node whose build slot the build holds (set while its build sandbox exists; build-slots.ts).
ALTER TABLE template_builds ADD COLUMN slot_node_id text;
-- A build waiting for a slot: since when (its place in the queue) and the nodes it could run on at its last look.
ALTER TABLE template_builds ADD COLUMN slot_waiting_since timestamptz;
ALTER TABLE template_builds ADD COLUMN slot_candidates text[];
CREATE INDEX template_builds_slots ON template_builds (slot_node_id) WHERE status = 'building';
`,
  },
  {
    version: 13,
    name: "build takeovers: how often another master continued a build whose master stopped",
    sql: `
-- Each takeover gives the build a new build sandbox id and token nonce (the run's identity: a stalled old runner can
-- no longer finish, fail or heartbeat the build).
ALTER TABLE template_builds ADD COLUMN takeovers integer NOT NULL DEFAULT 0;
`,
  },
  {
    version: 14,
    name: "build owners: the liveness lock of the master running a build",
    sql: `
-- The key of the advisory lock the running master holds (store/master-liveness.ts): once no session holds it, the
-- master died and the build is continued at once instead of after its heartbeat times out.
ALTER TABLE template_builds ADD COLUMN master_lock integer;
`,
  },
  {
    version: 15,
    name: "identity changes: a notification when a team or an API key changes",
    sql: `
-- The api keeps the identities of API keys it has seen (store/api-key-cache.ts) and forgets them all on this
-- notification, sent when the change commits: a revoked key or a team's new limits apply on every replica within
-- milliseconds, whoever made the change (the admin API, the CLI, SQL by hand). Channel: store/notify.ts, topic
-- "identity".
CREATE FUNCTION notify_identity_change() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('warren_identity_' || TG_TABLE_SCHEMA, TG_TABLE_NAME);
  RETURN NULL;
END
$fn$;
CREATE TRIGGER teams_identity_change AFTER UPDATE OR DELETE OR TRUNCATE ON teams
  FOR EACH STATEMENT EXECUTE FUNCTION notify_identity_change();
CREATE TRIGGER api_keys_identity_change AFTER UPDATE OR DELETE OR TRUNCATE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION notify_identity_change();
`,
  },
];

const MIGRATION_LOCK = 0x5741_5252; // "WARR"

/** Applies every migration not yet recorded in schema_migrations; returns the versions applied now. */
export async function migrate(db: Db, schema: string): Promise<number[]> {
  const applied: number[] = [];
  const client = await db.connect();
  try {
    // Lock first: two concurrent `CREATE SCHEMA IF NOT EXISTS` can still collide.
    await client.query("SELECT pg_advisory_lock($1, hashtext($2))", [MIGRATION_LOCK, schema]);
    try {
      await client.query(`CREATE SCHEMA IF NOT EXISTS ${assertSchemaName(schema)}`);
      await client.query(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
      );
      const done = await client.query<{ version: number }>("SELECT version FROM schema_migrations");
      const doneVersions = new Set(done.rows.map((row) => row.version));
      for (const migration of MIGRATIONS) {
        if (doneVersions.has(migration.version)) continue;
        await client.query("BEGIN");
        try {
          await client.query(migration.sql);
          await client.query("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", [
            migration.version,
            migration.name,
          ]);
          await client.query("COMMIT");
        } catch (error) {
          await client.query("ROLLBACK");
          throw new Error(`migration ${migration.version} (${migration.name}) failed: ${String(error)}`);
        }
        applied.push(migration.version);
      }
    } finally {
      await client.query("SELECT pg_advisory_unlock($1, hashtext($2))", [MIGRATION_LOCK, schema]);
    }
  } finally {
    client.release();
  }
  return applied;
}

export { withTransaction };
