import { closeSync, constants, openSync, readSync } from "node:fs";
import { uptime } from "node:os";
import type { Logger } from "@warren/platform/log";

/** A process the kernel killed at a memory cgroup's limit, as its log tells it. */
export interface OomVictim {
  /** The process's name (its `comm`: at most 15 characters). */
  readonly process: string;
  /** Its anonymous and shared memory when it was killed: what the kill freed. */
  readonly memoryBytes: number;
  /** The memory cgroup it was in (`/warren/<agent>/<instance>/workload`). */
  readonly memcg: string;
  /** When, as an ISO 8601 time (from the record's time since boot). */
  readonly at: string;
}

/** Victims kept per memory cgroup, the newest last. */
const KEPT_PER_CGROUP = 8;
const RECORD_BYTES = 8192;

/**
 * The kernel's OOM reports from /dev/kmsg: for each kill, the victim's name and memory, and its memory cgroup (so
 * the node can say which sandbox's process it was). The cgroup's own counter says only how many. Read without
 * blocking (O_NONBLOCK: a read returns one record, EAGAIN when none is left), whenever victims are asked for, so
 * nothing waits on the log and no thread is held. Where /dev/kmsg cannot be read, there are no victims, only counts.
 */
export class KernelOomLog {
  private fd: number | undefined;
  private unreadable = false;
  private readonly victims = new Map<string, OomVictim[]>();
  /** The `oom-kill:` record's cgroup by pid, until its `Killed process` record arrives. */
  private readonly pending = new Map<number, string>();
  /** When the kernel booted: records carry their time since boot. */
  private readonly bootMs = Date.now() - uptime() * 1000;

  constructor(
    private readonly log: Logger,
    private readonly path = "/dev/kmsg",
  ) {}

  /** The kills recorded for memory cgroups whose path starts with `memcgPrefix`, oldest first. */
  victimsUnder(memcgPrefix: string): OomVictim[] {
    this.drain();
    const found: OomVictim[] = [];
    for (const [memcg, victims] of this.victims) {
      if (memcg === memcgPrefix || memcg.startsWith(`${memcgPrefix}/`)) found.push(...victims);
    }
    return found.sort((a, b) => a.at.localeCompare(b.at));
  }

  /** Forgets a cgroup's victims (its sandbox is gone). */
  forget(memcgPrefix: string): void {
    for (const memcg of [...this.victims.keys()]) {
      if (memcg === memcgPrefix || memcg.startsWith(`${memcgPrefix}/`)) this.victims.delete(memcg);
    }
  }

  close(): void {
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }

  private drain(): void {
    if (this.unreadable) return;
    if (this.fd === undefined) {
      try {
        this.fd = openSync(this.path, constants.O_RDONLY | constants.O_NONBLOCK);
      } catch (error) {
        // Tried once: a node that cannot read it (no privilege) will not be able to later either.
        this.unreadable = true;
        this.log.info("the kernel log cannot be read: OOM kills are counted, not named", { error });
        return;
      }
    }
    const buffer = Buffer.alloc(RECORD_BYTES);
    for (;;) {
      let length: number;
      try {
        length = readSync(this.fd, buffer, 0, buffer.length, null);
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        // EPIPE: records were overwritten before this reader got to them; the next read goes on after them.
        if (code === "EPIPE") continue;
        return;
      }
      if (length <= 0) return;
      this.add(buffer.subarray(0, length).toString("utf8"));
    }
  }

  /** One record: `<prio>,<seq>,<usec since boot>,<flags>;<text>` and dictionary lines (ignored). */
  add(raw: string): void {
    const semicolon = raw.indexOf(";");
    if (semicolon < 0) return;
    const header = raw.slice(0, semicolon).split(",");
    const text = raw.slice(semicolon + 1).split("\n")[0] ?? "";
    const kill = /^oom-kill:.*[,]task_memcg=([^,]+),task=[^,]*,pid=(\d+)/.exec(text);
    if (kill) {
      this.pending.set(Number(kill[2]), kill[1] as string);
      if (this.pending.size > 1024) this.pending.delete(this.pending.keys().next().value as number);
      return;
    }
    const killed = /Killed process (\d+) \((.*?)\) .*?anon-rss:(\d+)kB.*?shmem-rss:(\d+)kB/.exec(text);
    if (!killed) return;
    const pid = Number(killed[1]);
    const memcg = this.pending.get(pid);
    if (memcg === undefined) return;
    this.pending.delete(pid);
    const usec = Number(header[2]);
    const victim: OomVictim = {
      process: killed[2] as string,
      memoryBytes: (Number(killed[3]) + Number(killed[4])) * 1024,
      memcg,
      at: new Date(this.bootMs + usec / 1000).toISOString(),
    };
    const list = [...(this.victims.get(memcg) ?? []), victim].slice(-KEPT_PER_CGROUP);
    this.victims.set(memcg, list);
  }
}
