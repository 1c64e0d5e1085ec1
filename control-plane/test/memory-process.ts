import type { Sandbox } from "e2b";
import { expect } from "vitest";

/**
 * A process whose state lives only in its memory: a random secret drawn at start and a counter it increments,
 * written out only when asked (SIGUSR1). A restored copy answering with the source's secret and a counter at least
 * as far as the source's proves processes and memory were carried over, not files. `/tmp/memory-process-ready`
 * says its trap is set (a signal before that would end it). Start it with `timeoutMs: 0`: a command's timeout is its
 * lifetime (E2B's semantics, counted by envd in the guest), and the SDK's default of 60 s of guest time ran out in
 * the forks of a slow run, which then had no process to report.
 */
export const MEMORY_PROCESS =
  "s=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n'); n=0; " +
  "trap 'echo \"$s $n\" > /tmp/report.tmp && mv /tmp/report.tmp /tmp/report' USR1; : > /tmp/memory-process-ready; " +
  "while :; do n=$((n+1)); sleep 0.1; done";

/** Asks the process for its state, once its trap is set. */
export async function reportMemory(sandbox: Sandbox, pid: number): Promise<{ secret: string; count: number }> {
  // Generous waits: TCG guests on a loaded 2-CPU host take seconds for a fork + exec.
  const wait = (file: string) => `for i in $(seq 1200); do [ -e ${file} ] && break; sleep 0.1; done`;
  let out: string;
  try {
    out = (
      await sandbox.commands.run(
        `${wait("/tmp/memory-process-ready")}; rm -f /tmp/report; kill -USR1 ${pid}; ${wait("/tmp/report")}; cat /tmp/report`,
        { timeoutMs: 300_000 },
      )
    ).stdout.trim();
  } catch (error) {
    throw new Error(`the memory process (pid ${pid}) did not report: ${String(error)}\n${await guestState(sandbox)}`);
  }
  const [secret, count] = out.split(" ");
  expect(secret).toMatch(/^[0-9a-f]{16}$/);
  return { secret: secret ?? "", count: Number(count) };
}

/** What the guest looks like when its memory process did not answer: its processes, /tmp, uptime, kernel log. */
async function guestState(sandbox: Sandbox): Promise<string> {
  const command =
    "echo '# uptime'; cat /proc/uptime; echo '# boot id'; cat /proc/sys/kernel/random/boot_id; " +
    "echo '# ps'; ps -eo pid,stat,etimes,args 2>&1 | head -40; echo '# /tmp'; ls -la /tmp 2>&1 | head -20; " +
    "echo '# mounts'; grep ' / ' /proc/mounts; echo '# dmesg'; dmesg 2>&1 | tail -25";
  return sandbox.commands.run(command, { user: "root", timeoutMs: 60_000 }).then(
    (r) => r.stdout,
    (e: unknown) => `(the guest's state could not be read: ${String(e)})`,
  );
}
