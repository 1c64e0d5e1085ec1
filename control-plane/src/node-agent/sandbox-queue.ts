/**
 * One queue per sandbox: pause, resume, checkpoint, snapshot and kill of one sandbox run one after another, never
 * interleaved; different sandboxes do not wait for each other.
 */
export class SandboxQueue {
  private readonly tails = new Map<string, Promise<void>>();

  /** Runs `fn` after every earlier operation on the same sandbox has finished (whatever its outcome). */
  run<T>(sandboxId: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(sandboxId) ?? Promise.resolve();
    const run = previous.then(fn, fn);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    this.tails.set(sandboxId, tail);
    void tail.then(() => {
      if (this.tails.get(sandboxId) === tail) this.tails.delete(sandboxId);
    });
    return run;
  }
}
