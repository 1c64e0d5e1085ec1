/**
 * Which masters are alive, as PostgreSQL sees them: each master holds a session-level advisory lock
 * (MASTER_LIVENESS_CLASS, its key) on a connection of its own for as long as it runs. When its process dies, its
 * connection closes and PostgreSQL drops the lock at once, so work the master had claimed (a template build
 * records the key in `template_builds.master_lock`) is known abandoned within a pass, not after a heartbeat timeout.
 * Advisory locks are per database, not per schema: the class keeps these apart from every other lock, and keys are
 * random, so deployments sharing a database do not collide.
 */
export const MASTER_LIVENESS_CLASS = 0x4c49_5645; // "LIVE"

/** A random key for a new master: positive, so it reads back unchanged from `pg_locks.objid` (an oid). */
export function newLivenessKey(): number {
  return 1 + Math.floor(Math.random() * 0x7fff_fffe);
}

/** Takes the lock on the master's own connection; false when another session holds this key. */
export const TRY_LIVENESS_LOCK_SQL = "SELECT pg_try_advisory_lock($1, $2) AS ok";

/**
 * SQL: true when the master that holds key `column` is gone (no session holds its lock). NULL keys (rows written
 * before the column existed) never count as gone: their heartbeat's age decides alone.
 */
export function masterGoneSql(column: string): string {
  return `(${column} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ${MASTER_LIVENESS_CLASS}::oid AND l.objid = ${column}::oid AND l.objsubid = 2 AND l.granted))`;
}
