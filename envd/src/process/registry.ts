import type { ProcessSelector } from "@warren/proto/process/process_pb";
import { alreadyExists, invalidArgument, notFound } from "../errors.js";
import type { ManagedProcess } from "./managed-process.js";

/**
 * The processes envd started, by pid and by tag. A finished process stays findable for
 * `retentionMs` so that a late Connect still gets its output and exit; the commands that act
 * on a process (input, signals, resize) see only live ones.
 */
export class ProcessRegistry {
  private readonly byPid = new Map<number, ManagedProcess>();
  private readonly byTag = new Map<string, ManagedProcess>();
  private readonly expiries = new Set<NodeJS.Timeout>();

  constructor(private readonly retentionMs: number) {}

  /** Throws already_exists when a live process has `tag`. */
  checkTagFree(tag: string | undefined): void {
    if (tag !== undefined && this.byTag.get(tag)?.running) {
      throw alreadyExists(`a process with tag '${tag}' is already running`);
    }
  }

  add(process: ManagedProcess): void {
    this.checkTagFree(process.tag);
    // A pid or tag of a finished, retained process is reused by the new one.
    this.byPid.set(process.pid, process);
    if (process.tag !== undefined) this.byTag.set(process.tag, process);
    void process.whenExited().then(() => this.retire(process));
  }

  /** The selected process, live or recently finished. */
  find(selector: ProcessSelector | undefined): ManagedProcess {
    const process = this.lookup(selector);
    if (!process) throw notFound(`process with ${describeSelector(selector)} not found`);
    return process;
  }

  /** The selected process if it is still running. */
  findRunning(selector: ProcessSelector | undefined): ManagedProcess {
    const process = this.find(selector);
    if (!process.running) throw notFound(`process with ${describeSelector(selector)} not found (it has exited)`);
    return process;
  }

  running(): ManagedProcess[] {
    return [...this.byPid.values()].filter((process) => process.running);
  }

  all(): ManagedProcess[] {
    return [...this.byPid.values()];
  }

  /** Stops the retention timers; envd is shutting down. */
  close(): void {
    for (const timer of this.expiries) clearTimeout(timer);
    this.expiries.clear();
  }

  private lookup(selector: ProcessSelector | undefined): ManagedProcess | undefined {
    const choice = selector?.selector;
    switch (choice?.case) {
      case "pid":
        return this.byPid.get(choice.value);
      case "tag":
        return this.byTag.get(choice.value);
      default:
        throw invalidArgument("process selector must give a pid or a tag");
    }
  }

  private retire(process: ManagedProcess): void {
    const timer = setTimeout(() => {
      this.expiries.delete(timer);
      this.forget(process);
    }, this.retentionMs);
    timer.unref();
    this.expiries.add(timer);
  }

  private forget(process: ManagedProcess): void {
    if (this.byPid.get(process.pid) === process) this.byPid.delete(process.pid);
    if (process.tag !== undefined && this.byTag.get(process.tag) === process) this.byTag.delete(process.tag);
  }
}

export function describeSelector(selector: ProcessSelector | undefined): string {
  const choice = selector?.selector;
  if (choice?.case === "pid") return `pid ${choice.value}`;
  if (choice?.case === "tag") return `tag '${choice.value}'`;
  return "no selector";
}
