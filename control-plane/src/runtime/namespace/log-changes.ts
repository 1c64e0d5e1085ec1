import { type FSWatcher, watch } from "node:fs";

/**
 * Wakes a waiter when a file changes (inotify, through `fs.watch`), or after a fallback delay: a sandbox's start
 * is waited for on its log (envd writes "envd listening" as it starts to listen) instead of by asking envd every few
 * milliseconds, which on a busy node took CPU from the starts themselves. A file that cannot be watched (not there)
 * leaves only the delay.
 */
export class LogChanges {
  private watcher: FSWatcher | undefined;
  private changed = false;
  private wake: (() => void) | undefined;

  constructor(file: string) {
    try {
      this.watcher = watch(file, { persistent: false }, () => {
        this.changed = true;
        this.wake?.();
      });
      this.watcher.on("error", () => this.close());
    } catch {
      this.watcher = undefined;
    }
  }

  /**
   * Resolves at once if the file changed since the last call, else at its next change or after `fallbackMs`: with
   * whether the file changed (false: the delay ran out).
   */
  next(fallbackMs: number): Promise<boolean> {
    if (this.changed) {
      this.changed = false;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const done = (changed: boolean) => {
        clearTimeout(timer);
        this.wake = undefined;
        this.changed = false;
        resolve(changed);
      };
      const timer = setTimeout(() => done(false), fallbackMs);
      this.wake = () => done(true);
    });
  }

  close(): void {
    this.watcher?.close();
    this.watcher = undefined;
    this.wake?.();
  }
}
