import { readFile, statfs } from "node:fs/promises";
import { cpus } from "node:os";

interface CpuSample {
  busy: number;
  total: number;
}

/** E2B's /metrics body (snake_case, as envd's Go server sends it). */
export interface SandboxMetrics {
  ts: number;
  cpu_count: number;
  cpu_used_pct: number;
  mem_total: number;
  mem_used: number;
  mem_cache: number;
  mem_total_mib: number;
  mem_used_mib: number;
  disk_used: number;
  disk_total: number;
}

/** CPU use is measured between two calls, so the first call reports use since boot. */
export class MetricsSampler {
  private previous: CpuSample = { busy: 0, total: 0 };

  async sample(): Promise<SandboxMetrics> {
    const [stat, meminfo, disk] = await Promise.all([
      readFile("/proc/stat", "utf8"),
      readFile("/proc/meminfo", "utf8"),
      statfs("/"),
    ]);
    const cpu = parseCpu(stat);
    const busyDelta = cpu.busy - this.previous.busy;
    const totalDelta = cpu.total - this.previous.total;
    this.previous = cpu;
    const mem = parseMeminfo(meminfo);
    const memTotal = mem.MemTotal ?? 0;
    const memAvailable = mem.MemAvailable ?? 0;
    const memCache = (mem.Cached ?? 0) + (mem.Buffers ?? 0);
    const memUsed = memTotal - memAvailable;
    const diskTotal = disk.blocks * disk.bsize;
    return {
      ts: Math.floor(Date.now() / 1000),
      cpu_count: cpus().length,
      cpu_used_pct: totalDelta > 0 ? Math.round((busyDelta / totalDelta) * 10000) / 100 : 0,
      mem_total: memTotal,
      mem_used: memUsed,
      mem_cache: memCache,
      mem_total_mib: Math.floor(memTotal / (1 << 20)),
      mem_used_mib: Math.floor(memUsed / (1 << 20)),
      disk_used: diskTotal - disk.bfree * disk.bsize,
      disk_total: diskTotal,
    };
  }
}

function parseCpu(stat: string): CpuSample {
  const line = stat.split("\n").find((l) => l.startsWith("cpu ")) ?? "";
  const fields = line.trim().split(/\s+/).slice(1).map(Number);
  const idle = (fields[3] ?? 0) + (fields[4] ?? 0);
  const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}

function parseMeminfo(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const match = /^(\w+):\s+(\d+)\s*kB/.exec(line);
    if (match?.[1] && match[2]) out[match[1]] = Number(match[2]) * 1024;
  }
  return out;
}
