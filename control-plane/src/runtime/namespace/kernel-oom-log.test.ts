import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { silentLogger } from "@warren/platform/log";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KernelOomLog } from "./kernel-oom-log.js";

// The parser against the records this host's kernel wrote for a real OOM kill in a sandbox's workload cgroup; the
// whole-cluster test in e2e/test/budgets.test.ts reads /dev/kmsg for real.
const RECORDS = [
  "6,1201,2141133127,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=1000",
  "6,1240,2141133457,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/warren/ea/i6c283605bf00/workload,task_memcg=/warren/ea/i6c283605bf00/workload,task=python3,pid=30874,uid=101000",
  "3,1241,2141133473,-;Memory cgroup out of memory: Killed process 30874 (python3) total-vm:3159504kB, anon-rss:457600kB, file-rss:5412kB, shmem-rss:0kB, UID:101000 pgtables:968kB oom_score_adj:1000",
  "3,1242,2141133480,-;Memory cgroup out of memory: Killed process 1 (init) total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0",
];

describe("KernelOomLog", () => {
  let dir = "";

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "warren-kmsg-"));
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("names each victim of a memory cgroup's OOM kill, with its memory and cgroup; other records are ignored", () => {
    const log = new KernelOomLog(silentLogger, join(dir, "no-such-kmsg"));
    for (const record of RECORDS) log.add(record);
    expect(log.victimsUnder("/warren/ea/i6c283605bf00")).toEqual([
      {
        process: "python3",
        memoryBytes: 457600 * 1024,
        memcg: "/warren/ea/i6c283605bf00/workload",
        at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
      },
    ]);
    expect(log.victimsUnder("/warren/ea/iother")).toEqual([]);
    log.forget("/warren/ea/i6c283605bf00");
    expect(log.victimsUnder("/warren/ea/i6c283605bf00")).toEqual([]);
  });

  it("reads /dev/kmsg without blocking, one record per read, where the host lets it", () => {
    // A blocking read would hang here (and the test time out): the drain stops at EAGAIN.
    const log = new KernelOomLog(silentLogger);
    expect(log.victimsUnder("/warren/no-such-agent")).toEqual([]);
    log.close();
  });
});
