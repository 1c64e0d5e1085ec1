import { performance } from "node:perf_hooks";
import { type V1Lease, V1MicroTime } from "@kubernetes/client-node";
import type { Leadership } from "../leader.js";
import type { Logger } from "../log.js";
import { describeError, type KubernetesApi, statusOf, within } from "./api.js";

export interface LeaseElectionOptions {
  readonly api: Pick<KubernetesApi, "coordination">;
  readonly namespace: string;
  readonly name: string;
  /** This replica's holderIdentity; unique per process (the caller appends a random suffix to the pod name). */
  readonly identity: string;
  /** leaseDurationSeconds written into the Lease, and how long a standby waits on a Lease that stopped changing. */
  readonly leaseSeconds: number;
  /** How often the leader renews and a standby looks at the Lease. */
  readonly retryMs: number;
  readonly onElected: () => void;
  readonly onDemoted: () => void;
  readonly log: Logger;
}

/** The fields of a Lease that change on every renewal and every change of holder. */
function recordKey(lease: V1Lease): string {
  const spec = lease.spec ?? {};
  return JSON.stringify([
    spec.holderIdentity ?? "",
    String(spec.renewTime ?? ""),
    String(spec.acquireTime ?? ""),
    spec.leaseTransitions ?? 0,
    spec.leaseDurationSeconds ?? 0,
  ]);
}

/**
 * Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules:
 *  - a standby takes the Lease only when it has no holder, or when the Lease has not changed for
 *    leaseDurationSeconds as measured on the standby's own monotonic clock since it last saw it change (so clock
 *    skew between replicas does not matter, only clock rate);
 *  - every write is an update carrying the resourceVersion read just before (optimistic concurrency): of two
 *    replicas racing for the same Lease, the API server accepts one and answers 409 Conflict to the other;
 *  - the leader steps down by itself when it has not renewed within the renew deadline (2/3 of the lease
 *    duration, counted from the start of its last successful renewal): it stops leading before any standby can
 *    consider the Lease expired, even if it cannot reach the API server at all.
 * On stop the leader clears holderIdentity, so a standby takes over on its next look instead of waiting.
 * Timers live in PostgreSQL (sandboxes.end_at), so a new leader finds every one of them.
 */
export class LeaseElection implements Leadership {
  private leading = false;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  private deadline: NodeJS.Timeout | undefined;
  private observed: { key: string; at: number } | undefined;
  private running: Promise<void> | undefined;

  constructor(private readonly options: LeaseElectionOptions) {}

  get isLeader(): boolean {
    return this.leading;
  }

  private get leaseMs(): number {
    return this.options.leaseSeconds * 1000;
  }

  private get renewDeadlineMs(): number {
    return Math.floor((this.leaseMs * 2) / 3);
  }

  start(): void {
    this.running = this.tick();
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.running = this.tick();
    }, this.options.retryMs);
  }

  private async tick(): Promise<void> {
    const startedAt = performance.now();
    try {
      const outcome = await within(this.tryAcquireOrRenew(), this.renewDeadlineMs, "lease request");
      if (this.stopped) return;
      if (outcome === "held") this.renewed(startedAt);
      else if (outcome === "taken" && this.leading) this.demote("another replica holds the lease");
      // "conflict": the Lease changed between our read and our write; the next look tells by whom.
    } catch (error) {
      // Keep leading until the renew deadline: one failed request is not a lost lease.
      this.options.log.warn("lease request failed", { lease: this.options.name, error: describeError(error) });
    }
    this.schedule();
  }

  private renewed(startedAt: number): void {
    if (this.deadline) clearTimeout(this.deadline);
    const left = startedAt + this.renewDeadlineMs - performance.now();
    // A renewal answered after its own deadline proves nothing about now: wait for the next one.
    if (left <= 0) {
      this.demote("lease renewal answered too late");
      return;
    }
    this.deadline = setTimeout(() => this.demote(`lease not renewed within ${this.renewDeadlineMs} ms`), left);
    if (!this.leading) {
      this.leading = true;
      this.options.log.info("elected leader", { lease: this.options.name, identity: this.options.identity });
      this.options.onElected();
    }
  }

  private demote(reason: string): void {
    if (this.deadline) clearTimeout(this.deadline);
    this.deadline = undefined;
    if (!this.leading) return;
    this.leading = false;
    this.options.log.warn("lost leadership", { lease: this.options.name, reason });
    this.options.onDemoted();
  }

  /**
   * One look at the Lease: `held` when this replica holds it afterwards, `taken` when another replica holds it,
   * `conflict` when our write lost a race (409) and the next look must tell.
   */
  private async tryAcquireOrRenew(): Promise<"held" | "taken" | "conflict"> {
    const { coordination } = this.options.api;
    const { namespace, name, identity, leaseSeconds } = this.options;
    const now = new V1MicroTime();
    let lease: V1Lease;
    try {
      lease = await coordination.readNamespacedLease({ name, namespace });
    } catch (error) {
      if (statusOf(error) !== 404) throw error;
      const body: V1Lease = {
        apiVersion: "coordination.k8s.io/v1",
        kind: "Lease",
        metadata: { name, namespace },
        spec: {
          holderIdentity: identity,
          leaseDurationSeconds: leaseSeconds,
          acquireTime: now,
          renewTime: now,
          leaseTransitions: 0,
        },
      };
      try {
        const created = await coordination.createNamespacedLease({ namespace, body });
        this.observe(created);
        return "held";
      } catch (createError) {
        if (statusOf(createError) === 409) return "conflict"; // another replica created it first
        throw createError;
      }
    }
    this.observe(lease);
    const spec = lease.spec ?? {};
    const holder = spec.holderIdentity ?? "";
    const mine = holder === identity;
    if (holder && !mine) {
      const durationMs = (spec.leaseDurationSeconds ?? leaseSeconds) * 1000;
      if (performance.now() - (this.observed?.at ?? 0) < durationMs) return "taken";
      this.options.log.info("lease expired; taking it over", { lease: name, previousHolder: holder });
    }
    const body: V1Lease = {
      ...lease,
      spec: {
        ...spec,
        holderIdentity: identity,
        leaseDurationSeconds: leaseSeconds,
        renewTime: now,
        acquireTime: mine ? (spec.acquireTime ?? now) : now,
        leaseTransitions: mine ? (spec.leaseTransitions ?? 0) : (spec.leaseTransitions ?? 0) + 1,
      },
    };
    try {
      const updated = await coordination.replaceNamespacedLease({ name, namespace, body });
      this.observe(updated);
      return "held";
    } catch (error) {
      if (statusOf(error) === 409) return "conflict"; // changed since we read it: someone else renewed or took it
      throw error;
    }
  }

  private observe(lease: V1Lease): void {
    const key = recordKey(lease);
    if (this.observed?.key !== key) this.observed = { key, at: performance.now() };
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.running?.catch(() => undefined);
    const wasLeading = this.leading;
    this.demote("stopping");
    if (wasLeading) await this.release().catch(() => undefined);
  }

  /** Clears holderIdentity if this replica still holds the Lease, so a standby need not wait for it to expire. */
  private async release(): Promise<void> {
    const { coordination } = this.options.api;
    const { namespace, name, identity } = this.options;
    const lease = await within(coordination.readNamespacedLease({ name, namespace }), 5_000, "lease read");
    if (lease.spec?.holderIdentity !== identity) return;
    const now = new V1MicroTime();
    const { holderIdentity: _released, ...spec } = lease.spec;
    await within(
      coordination.replaceNamespacedLease({
        name,
        namespace,
        body: { ...lease, spec: { ...spec, leaseDurationSeconds: 1, renewTime: now } },
      }),
      5_000,
      "lease release",
    );
    this.options.log.info("released the lease", { lease: name });
  }
}
