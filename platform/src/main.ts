import { ConfigError } from "./env.js";
import type { Logger } from "./log.js";

/** What a started process gives back: how to stop it (stop accepting, drain, release). */
export interface Stoppable {
  stop(signal: NodeJS.Signals): Promise<void>;
  /** Where stopping is logged, when the process made a logger of its own at start (its level, its node id). */
  readonly log?: Logger;
}

export interface RunMainOptions {
  /** The program's name, first on the line that explains a bad configuration. */
  readonly name: string;
  /** Where a failure to start is logged (and stopping, unless the started process gives its own). */
  readonly log: Logger;
  /** Printed after a configuration error (the flags and env vars the program reads). */
  readonly usage?: string;
  /**
   * For errors other than `ConfigError` that are the operator's to fix: the line to print (exit 2, like a
   * configuration error), or undefined for a failure that is logged (exit 1).
   */
  readonly explainUsageError?: (error: unknown) => string | undefined;
}

/**
 * Every Warren process's `main`: start it, then on the first SIGTERM or SIGINT stop it (a second signal while
 * draining is ignored) and exit 0, or 1 when stopping failed. A configuration error exits 2 with the message (and
 * the usage) on stderr; any other failure to start is logged and exits 1. Never leaves a rejected promise at the
 * top level.
 */
export function runMain(start: () => Promise<Stoppable>, options: RunMainOptions): void {
  start().then(
    (running) => {
      const log = running.log ?? options.log;
      let stopping = false;
      const onSignal = (signal: NodeJS.Signals) => {
        if (stopping) return;
        stopping = true;
        log.info("stopping", { signal });
        running.stop(signal).then(
          () => process.exit(0),
          (error: unknown) => {
            log.error("stop failed", { error });
            process.exit(1);
          },
        );
      };
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    },
    (error: unknown) => {
      const explained =
        error instanceof ConfigError ? error.message : (options.explainUsageError?.(error) ?? undefined);
      if (explained !== undefined) {
        const usage = options.usage ? `\n${options.usage}` : "";
        process.stderr.write(`${options.name}: ${explained}${usage}\n`);
        process.exit(2);
      }
      options.log.error("failed to start", { error });
      process.exit(1);
    },
  );
}
