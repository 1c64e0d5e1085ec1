import type { Sandbox } from "e2b";
import { expect } from "vitest";

/**
 * A process whose state lives only in its memory: a random secret drawn at start and a counter it increments,
 * written out only when asked (SIGUSR1). A restored copy answering with the source's secret and a counter at least
 * as far as the source's proves processes and memory were carried over, not files. `/tmp/memory-process-ready`
 * says its trap is set (a signal before that would end it).
 */
export const MEMORY_PROCESS =
  "s=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n'); n=0; " +
  "trap 'echo \"$s $n\" > /tmp/report.tmp && mv /tmp/report.tmp /tmp/report' USR1; : > /tmp/memory-process-ready; " +
  "while :; do n=$((n+1)); sleep 0.1; done";

/** Asks the process for its state, once its trap is set. */
export async function reportMemory(sandbox: Sandbox, pid: number): Promise<{ secret: string; count: number }> {
  // Generous waits: TCG guests on a loaded 2-CPU host take seconds for a fork + exec.
  const wait = (file: string) => `for i in $(seq 1200); do [ -e ${file} ] && break; sleep 0.1; done`;
  const out = (
    await sandbox.commands.run(
      `${wait("/tmp/memory-process-ready")}; rm -f /tmp/report; kill -USR1 ${pid}; ${wait("/tmp/report")}; cat /tmp/report`,
      { timeoutMs: 300_000 },
    )
  ).stdout.trim();
  const [secret, count] = out.split(" ");
  expect(secret).toMatch(/^[0-9a-f]{16}$/);
  return { secret: secret ?? "", count: Number(count) };
}
