import { invalidArgument, notFound } from "../errors.js";
import type { Logger } from "../log.js";

/** Request header (Warren) on process.Start: the process holds a lease of this many ms and is reaped unless renewed. */
export const LEASE_HEADER = "warren-lease-ttl-ms";
export const MIN_LEASE_MS = 100;
export const MAX_LEASE_MS = 7 * 24 * 3600_000;
// Checked this often; a gap between checks longer than MAX_AWAKE_STEP_MS is time envd did not run.
const TICK_MS = 100;
const MAX_AWAKE_STEP_MS = 1_000;
const JOURNAL_MAX = 1_000;

/** What a lease needs of its process. */
export interface LeasedProcess {
  readonly pid: number;
  readonly tag: string | undefined;
  readonly running: boolean;
  signal(signal: NodeJS.Signals): void;
  whenExited(): Promise<unknown>;
}

/**
 * Milliseconds envd has been running, not counting time it was stopped. CLOCK_MONOTONIC (Node's timers,
 * performance.now) keeps advancing while the cgroup freezer holds the sandbox — e2e/test/harness.test.ts
 * measured 7.3 s of it across a 6.9 s pause — and CLOCK_BOOTTIME does too; only a clock that counts steps of a ticker that was
 * itself frozen stops. A step longer than MAX_AWAKE_STEP_MS is a pause (freezer, CRIU, SIGSTOP) and counts as
 * one tick, so a lease never loses time while its sandbox is paused; a heavily loaded envd may give leases up to
 * that much extra time, never less.
 */
export class AwakeClock {
  private awake = 0;
  private last: number;

  constructor(private readonly monotonic: () => number = () => performance.now()) {
    this.last = monotonic();
  }

  now(): number {
    const current = this.monotonic();
    const step = current - this.last;
    this.last = current;
    if (step > 0) this.awake += step > MAX_AWAKE_STEP_MS ? TICK_MS : step;
    return this.awake;
  }
}

export interface LeaseView {
  readonly pid: number;
  readonly tag: string | undefined;
  readonly ttlMs: number;
  /** Awake ms left before the lease expires (0: expired, being reaped). */
  readonly remainingMs: number;
  /** Wall-clock estimate of the expiry, for display: now + remainingMs (a pause pushes it back). */
  readonly expiresAt: string;
  readonly renewals: number;
  readonly reaping: boolean;
}

export interface LeaseEvent {
  readonly seq: number;
  readonly type: "process.lease" | "process.lease_renewed" | "process.lease_reaped";
  readonly pid: number;
  readonly tag: string | undefined;
  readonly ttlMs: number;
  /** For reaps: the signal that ended the process (SIGTERM, or SIGKILL after the grace). */
  readonly signal?: string;
  readonly at: string;
}

interface Lease {
  readonly process: LeasedProcess;
  ttlMs: number;
  expiresAt: number;
  renewals: number;
  reapStartedAt: number | undefined;
}

/**
 * The leases of background processes: each expires `ttlMs` of awake time after its start or last renewal; an
 * expired one is reaped — SIGTERM to its process group, SIGKILL after `graceMs` if it is still there. Every lease,
 * renewal and reap is appended to a bounded journal (`events(after)`) and logged, for the ledger.
 */
export class LeaseBook {
  private readonly leases = new Map<number, Lease>();
  private readonly journal: LeaseEvent[] = [];
  private seq = 0;
  /**
   * Ticks only while there are leases: an idle envd (most sandboxes, every pooled one) then has no timer waking it
   * ten times a second (~2 ms of CPU a second per sandbox on this machine's kind). The clock's first step after a
   * quiet spell is longer than MAX_AWAKE_STEP_MS and counts as one tick, and no lease was running meanwhile.
   */
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly graceMs: number,
    private readonly log: Logger,
    private readonly clock = new AwakeClock(),
  ) {}

  add(process: LeasedProcess, ttlMs: number): void {
    if (!this.timer) {
      this.timer = setInterval(() => this.check(), TICK_MS);
      this.timer.unref();
    }
    const now = this.clock.now();
    this.leases.set(process.pid, { process, ttlMs, expiresAt: now + ttlMs, renewals: 0, reapStartedAt: undefined });
    void process.whenExited().then(() => this.leases.delete(process.pid));
    this.record("process.lease", process, ttlMs);
  }

  /** Extends the lease by `ttlMs` (default: its own) from now; a lease being reaped can no longer be renewed. */
  renew(pid: number, ttlMs: number | undefined): LeaseView {
    const lease = this.leases.get(pid);
    if (!lease || !lease.process.running) throw notFound(`process with pid ${pid} has no lease (not leased or ended)`);
    if (lease.reapStartedAt !== undefined) throw notFound(`lease of pid ${pid} expired; the process is being reaped`);
    if (ttlMs !== undefined) lease.ttlMs = ttlMs;
    lease.expiresAt = this.clock.now() + lease.ttlMs;
    lease.renewals += 1;
    this.record("process.lease_renewed", lease.process, lease.ttlMs);
    return this.view(lease, this.clock.now());
  }

  list(): LeaseView[] {
    const now = this.clock.now();
    return [...this.leases.values()].filter((l) => l.process.running).map((l) => this.view(l, now));
  }

  /** Journal entries after `seq` (oldest first). */
  events(after: number): LeaseEvent[] {
    return this.journal.filter((e) => e.seq > after);
  }

  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  private check(): void {
    if (this.leases.size === 0) {
      this.close();
      return;
    }
    const now = this.clock.now();
    for (const lease of this.leases.values()) {
      if (!lease.process.running) continue;
      if (lease.reapStartedAt === undefined && now >= lease.expiresAt) {
        lease.reapStartedAt = now;
        lease.process.signal("SIGTERM");
        this.record("process.lease_reaped", lease.process, lease.ttlMs, "SIGTERM");
      } else if (lease.reapStartedAt !== undefined && now >= lease.reapStartedAt + this.graceMs) {
        lease.reapStartedAt = Number.POSITIVE_INFINITY;
        lease.process.signal("SIGKILL");
        this.record("process.lease_reaped", lease.process, lease.ttlMs, "SIGKILL");
      }
    }
  }

  private view(lease: Lease, now: number): LeaseView {
    const remainingMs = Math.max(0, Math.round(lease.expiresAt - now));
    return {
      pid: lease.process.pid,
      tag: lease.process.tag,
      ttlMs: lease.ttlMs,
      remainingMs,
      expiresAt: new Date(Date.now() + remainingMs).toISOString(),
      renewals: lease.renewals,
      reaping: lease.reapStartedAt !== undefined,
    };
  }

  private record(type: LeaseEvent["type"], process: LeasedProcess, ttlMs: number, signal?: string): void {
    this.seq += 1;
    const event: LeaseEvent = {
      seq: this.seq,
      type,
      pid: process.pid,
      tag: process.tag,
      ttlMs,
      ...(signal ? { signal } : {}),
      at: new Date().toISOString(),
    };
    this.journal.push(event);
    if (this.journal.length > JOURNAL_MAX) this.journal.shift();
    this.log.info(type, { pid: process.pid, tag: process.tag, ttlMs, ...(signal ? { signal } : {}) });
  }
}

/** A lease length from the Start header or a renew body: whole ms within the limits. */
export function parseLeaseMs(raw: unknown, what: string): number {
  const value = typeof raw === "string" && raw.trim() !== "" ? Number(raw.trim()) : raw;
  if (typeof value !== "number" || !Number.isInteger(value) || value < MIN_LEASE_MS || value > MAX_LEASE_MS) {
    throw invalidArgument(
      `${what} must be an integer from ${MIN_LEASE_MS} to ${MAX_LEASE_MS} ms, got ${JSON.stringify(raw)}`,
    );
  }
  return value;
}
