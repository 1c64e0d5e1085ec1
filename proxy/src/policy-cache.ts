import { EXEC_POLICY_EVENT_ALL, type ExecPolicy, execPolicyEventsChannel } from "@warren/proto/exec-policy";
import type { Redis } from "ioredis";
import { EventCache } from "./cache.js";
import { ChannelFollower } from "./channel-follower.js";
import type { PolicySource } from "./exec-gate.js";
import type { Logger } from "./log.js";

export interface PolicyCacheOptions {
  /** Upper bound on a copy's age (the route cache's TTL); 0 reads Redis on every start. */
  readonly ttlMs: number;
  readonly maxTeams: number;
}

/**
 * Teams' exec policies kept in memory, so a `process.Start` does not wait for Redis (one `MGET` per start before):
 * a team's copy is dropped when the master announces a change of its policy, every copy when a full sync changed
 * something, and all of them while the announcements cannot be heard. Failures to read (Redis away, the mirror not
 * synced: fail closed) are never kept.
 */
export class CachedPolicySource implements PolicySource {
  private readonly cache: EventCache<ExecPolicy | undefined>;
  private readonly events: ChannelFollower;

  constructor(source: PolicySource, subscriber: Redis, keyPrefix: string, options: PolicyCacheOptions, log: Logger) {
    this.cache = new EventCache(options.ttlMs, options.maxTeams, (team) => source.policyOf(team));
    this.events = new ChannelFollower(
      subscriber,
      execPolicyEventsChannel(keyPrefix),
      {
        message: (team) => (team === EXEC_POLICY_EVENT_ALL ? this.cache.clear() : this.cache.invalidate(team)),
        live: (live) => this.cache.setEnabled(live),
      },
      log,
      "exec policy events",
    );
  }

  start(): Promise<void> {
    return this.events.start();
  }

  close(): void {
    this.events.close();
  }

  policyOf(teamId: string): Promise<ExecPolicy | undefined> {
    return this.cache.get(teamId);
  }

  /** Teams whose policy is held (tests). */
  get size(): number {
    return this.cache.size;
  }
}
