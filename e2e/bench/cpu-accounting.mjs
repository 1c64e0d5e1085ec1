// Where a benchmark phase's CPU went on this host, by component (issue 20): a burst on a small node is bound by
// CPU, not by a lock, and the way to a faster burst is a cheaper create. Read from /proc, so it covers every
// process on the host (the benchmark's own SDK client too), not only Warren's.
import { readdirSync, readFileSync } from "node:fs";

/** Clock ticks per second of /proc's CPU times (USER_HZ, 100 on every Linux architecture Warren runs on). */
const TICK_MS = 10;

/** What each process's command line says it is; the first match wins. */
const COMPONENTS = [
  [/\/envd\/dist\/envd\.cjs|\/envd\/dist\/main\.js/, "envd (in sandboxes)"],
  [/\/code-gateway\/dist\/main\.js|jupyter|ipykernel/, "code gateway and kernels"],
  [/^\/opt\/warren\/envd\/dist\/warren-exec/, "sandbox commands (envd's spawner and its children)"],
  [/warren-exec --serve/, "host tools (the node agent's spawner and its children)"],
  [/node-agent\/main\.js/, "node agent"],
  [/api-master\/main\.js/, "api and master (one process)"],
  [/master\/main\.js/, "master"],
  [/api\/main\.js/, "api"],
  [/proxy\/dist\/main\.js/, "proxy"],
  [/^postgres|postgresql/, "PostgreSQL"],
  [/redis-server/, "Redis"],
  [/^\(kworker|^\(ksoftirqd|^\(rcu|^\(kdamond|^\(migration|^\(loop\d/, "kernel threads (writeback, network, …)"],
];

/** Components whose processes are counted apart by whether they ran before the phase (a warm pool's) or not. */
const SPLIT_BY_START = new Set(["envd (in sandboxes)", "code gateway and kernels"]);

function component(pid, cmdline) {
  if (pid === String(process.pid)) return "this benchmark (the official SDK as client)";
  for (const [pattern, name] of COMPONENTS) if (pattern.test(cmdline)) return name;
  return "other processes";
}

/** Every process's own CPU time and that of its children it has reaped (ms), with the host's busy time. */
export function sampleCpu() {
  const processes = new Map();
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const cmdline =
        readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim() ||
        stat.slice(stat.indexOf("("), stat.lastIndexOf(")") + 1);
      // Fields 14–17 of stat: utime, stime, cutime, cstime. A tool that ran and ended between two samples is only
      // in its parent's children's time (the spawner's, for the node agent's tools).
      const [own, children] = [Number(fields[11]) + Number(fields[12]), Number(fields[13]) + Number(fields[14])];
      processes.set(`${pid} ${fields[19]}`, { pid, cmdline, own: own * TICK_MS, children: children * TICK_MS });
    } catch {
      // Ended while being read.
    }
  }
  const cpu = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal: busy is everything but idle and iowait.
  const busy = (cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6] + (cpu[7] ?? 0)) * TICK_MS;
  const total = busy + (cpu[3] + cpu[4]) * TICK_MS;
  return { processes, busy, total, at: performance.now() };
}

/**
 * CPU used between two samples by component, in ms, largest first, with the host's busy and available time. A
 * process that started and ended between them counts only where its parent reaped it.
 */
export function cpuBetween(before, after) {
  const byComponent = new Map();
  for (const [key, now] of after.processes) {
    const then = before.processes.get(key);
    const used = now.own - (then?.own ?? 0) + (now.children - (then?.children ?? 0));
    if (used <= 0) continue;
    // A sandbox's envd that was already running (a pool's, claimed) apart from those that started meanwhile.
    const base = component(now.pid, now.cmdline);
    const name = SPLIT_BY_START.has(base) ? `${base}: ${then ? "already running" : "started meanwhile"}` : base;
    byComponent.set(name, (byComponent.get(name) ?? 0) + used);
  }
  return {
    components: [...byComponent].sort((a, b) => b[1] - a[1]),
    busyMs: after.busy - before.busy,
    availableMs: after.total - before.total,
    wallMs: after.at - before.at,
  };
}

/** Prints a phase's CPU per operation (e.g. per create), component by component. */
export function printCpuPer(label, used, operations) {
  const per = (ms) => `${(ms / operations).toFixed(1)} ms`;
  const attributed = used.components.reduce((sum, [, ms]) => sum + ms, 0);
  console.log(
    `${label}: host CPU busy ${(used.busyMs / 1000).toFixed(1)} s of ${(used.availableMs / 1000).toFixed(1)} s ` +
      `over ${(used.wallMs / 1000).toFixed(1)} s; per operation (n=${operations}) ${per(used.busyMs)}, of which:`,
  );
  for (const [name, ms] of used.components.filter(([, ms]) => ms / operations >= 0.5)) {
    console.log(`    ${per(ms).padStart(10)}  ${name}`);
  }
  console.log(
    `    ${per(Math.max(0, used.busyMs - attributed)).padStart(10)}  not attributed (interrupts, exited processes)`,
  );
}
