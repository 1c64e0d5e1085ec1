/**
 * Leader election on a coordination.k8s.io/v1 Lease between master replicas, against the fake API server
 * (one listener per replica, so a test can cut one replica off) with the real PostgreSQL and Redis for timers.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectKubernetes } from "../src/master/kubernetes/api.js";
import { LeaseElection } from "../src/master/kubernetes/lease-election.js";
import { silentLogger } from "../src/master/log.js";
import { NodeAgentError } from "../src/master/node-agent-client.js";
import { Master } from "../src/master/server.js";
import { eventually, TestEnv } from "./api-harness.js";
import {
  AGENT_LABELS,
  allowedByRbac,
  FakeKubernetesApi,
  kubernetesConfig,
  NAMESPACE,
} from "./master-kubernetes-fake-api.js";

const LEASE = "wr-warren-master";
const MICRO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/;

/** Samples `leaders()` every few ms and remembers whether two replicas ever led at once. */
class LeadershipMonitor {
  doubleLeadership = 0;
  samples = 0;
  private readonly timer: NodeJS.Timeout;
  constructor(leaders: () => boolean[]) {
    this.timer = setInterval(() => {
      this.samples++;
      if (leaders().filter(Boolean).length > 1) this.doubleLeadership++;
    }, 2);
  }
  stop(): void {
    clearInterval(this.timer);
  }
}

describe("master leader election on a Kubernetes Lease", () => {
  const env = new TestEnv();
  const fake = new FakeKubernetesApi();
  const masters: Master[] = [];
  let monitor: LeadershipMonitor;
  let teamId: string;

  async function startReplica(listener: number, identity: string): Promise<Master> {
    process.env.KUBECONFIG = fake.kubeconfig(listener, NAMESPACE);
    const master = await Master.start({
      config: env.masterConfig({ kubernetes: kubernetesConfig({ identity }), leaderIntervalMs: 100 }),
      nodeAgent: (nodeId) => {
        const node = env.nodes.get(nodeId);
        if (!node) throw new NodeAgentError("unavailable", `unknown node ${nodeId}`);
        return node;
      },
      log: silentLogger,
    });
    env.masters.push(master);
    masters.push(master);
    return master;
  }
  const lease = () => fake.lease(NAMESPACE, LEASE);
  const holder = () => String(lease()?.spec.holderIdentity ?? "");

  beforeAll(async () => {
    await fake.listen();
    await fake.listen();
    await fake.listen();
    fake.addNode("node-a");
    fake.addAgentPod(NAMESPACE, "wr-warren-node-agent-x7k2p", "node-a", "172.18.0.10", AGENT_LABELS);
    await env.addNode("node-a");
    monitor = new LeadershipMonitor(() => masters.map((m) => m.isLeader));
  });
  afterAll(async () => {
    monitor.stop();
    await env.stop();
    await fake.close();
  });

  it("the first replica creates the Lease and leads; MicroTime fields are in the API's format", async () => {
    const first = await startReplica(0, "master-one");
    ({ teamId } = await env.team("lease"));
    await eventually(async () => (first.isLeader ? true : undefined), "first leads");
    const created = lease();
    expect(created?.spec.holderIdentity).toMatch(/^master-one_[0-9a-f]{8}$/);
    expect(created?.spec.leaseDurationSeconds).toBe(1);
    expect(created?.spec.leaseTransitions).toBe(0);
    expect(String(created?.spec.renewTime)).toMatch(MICRO_TIME);
    expect(String(created?.spec.acquireTime)).toMatch(MICRO_TIME);
    expect(fake.requests.some((r) => r.method === "POST" && r.status === 201)).toBe(true);
  });

  it("the leader renews the Lease with conditional updates (resourceVersion)", async () => {
    const before = String(lease()?.spec.renewTime);
    await eventually(async () => (String(lease()?.spec.renewTime) !== before ? true : undefined), "a renewal");
    const puts = fake.requests.filter((r) => r.method === "PUT");
    expect(puts.length).toBeGreaterThan(0);
    for (const put of puts) expect(put.body?.metadata?.resourceVersion).toMatch(/^\d+$/);
    expect(lease()?.spec.leaseTransitions).toBe(0);
  });

  it("a standby does not lead while the Lease is renewed", async () => {
    const second = await startReplica(1, "master-two");
    // Three lease durations: a standby that ignored renewals would have taken over by now.
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    expect(second.isLeader).toBe(false);
    expect(masters[0]?.isLeader).toBe(true);
    expect(holder()).toMatch(/^master-one_/);
    expect(monitor.doubleLeadership).toBe(0);
  });

  it("when the leader cannot renew, it steps down first and the standby takes over after the lease duration", async () => {
    const [first, second] = masters as [Master, Master];
    // A timer set under the old leader: the new one must evict it.
    const { sandbox } = await second.lifecycle.create({
      teamId,
      templateId: "base",
      timeoutSeconds: 2,
      metadata: {},
      envVars: {},
      autoPause: false,
      autoPauseMemory: true,
      autoResume: false,
      network: null,
      allowInternetAccess: null,
      volumeMounts: [],
    });
    const lastRenewal = String(lease()?.spec.renewTime);
    fake.block(0); // the leader's requests now hang: it is cut off from the API server
    const cutAt = performance.now();
    await eventually(async () => (!first.isLeader ? true : undefined), "old leader steps down");
    const steppedDownAfter = performance.now() - cutAt;
    await eventually(async () => (second.isLeader ? true : undefined), "standby takes over");
    const tookOverAfter = performance.now() - cutAt;
    // Renew deadline is 2/3 of the 1 s lease; the standby waits a whole lease after it last saw a change.
    expect(steppedDownAfter).toBeLessThan(tookOverAfter);
    expect(holder()).toMatch(/^master-two_/);
    expect(lease()?.spec.leaseTransitions).toBe(1);
    expect(String(lease()?.spec.renewTime)).not.toBe(lastRenewal);
    expect(monitor.doubleLeadership).toBe(0);
    await eventually(
      async () =>
        (await env.db.query("SELECT 1 FROM sandboxes WHERE id = $1 AND state = 'killed'", [sandbox.sandboxId])).rowCount
          ? true
          : undefined,
      "the new leader evicts the sandbox",
    );
    // Reconnected, the old leader finds the Lease taken and stays a standby.
    fake.unblock(0);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(first.isLeader).toBe(false);
    expect(second.isLeader).toBe(true);
    expect(monitor.doubleLeadership).toBe(0);
  });

  it("a leader that stops releases the Lease, so a standby takes over without waiting for it to expire", async () => {
    const [first, second] = masters as [Master, Master];
    await second.stop();
    env.masters.splice(env.masters.indexOf(second), 1);
    masters.splice(masters.indexOf(second), 1);
    expect(lease()?.spec.holderIdentity).toBeUndefined();
    const stoppedAt = performance.now();
    await eventually(async () => (first.isLeader ? true : undefined), "standby takes the released lease");
    expect(performance.now() - stoppedAt).toBeLessThan(1_000);
    expect(lease()?.spec.leaseTransitions).toBe(2);
    expect(monitor.doubleLeadership).toBe(0);
  });

  it("a Lease held and renewed by another writer is never taken", async () => {
    const [first] = masters as [Master];
    await first.stop();
    env.masters.splice(env.masters.indexOf(first), 1);
    masters.splice(masters.indexOf(first), 1);
    const renew = () =>
      fake.writeLease(NAMESPACE, LEASE, {
        holderIdentity: "elsewhere_00000000",
        leaseDurationSeconds: 1,
        renewTime: new Date().toISOString().replace("Z", "000Z"),
        acquireTime: new Date().toISOString().replace("Z", "000Z"),
        leaseTransitions: 7,
      });
    renew();
    const renewer = setInterval(renew, 200);
    try {
      const third = await startReplica(2, "master-three");
      await new Promise((resolve) => setTimeout(resolve, 2_500));
      expect(third.isLeader).toBe(false);
      expect(holder()).toBe("elsewhere_00000000");
    } finally {
      clearInterval(renewer);
    }
    // The other writer stops renewing: after one lease duration the replica takes over.
    await eventually(async () => (masters[0]?.isLeader ? true : undefined), "takes over the abandoned lease");
    expect(lease()?.spec.leaseTransitions).toBe(8);
    expect(fake.requests.filter((r) => !allowedByRbac(r))).toEqual([]);
  });
});

describe("LeaseElection against update conflicts", () => {
  const fake = new FakeKubernetesApi();
  afterAll(() => fake.close());

  it("two electors racing for one Lease: the API server's 409 Conflict lets only one lead", async () => {
    await fake.listen();
    process.env.KUBECONFIG = fake.kubeconfig(0, NAMESPACE);
    const api = connectKubernetes({ mode: "kubeconfig" });
    // An expired Lease that both will try to take in the same instant.
    fake.writeLease(NAMESPACE, LEASE, {
      holderIdentity: "gone_00000000",
      leaseDurationSeconds: 1,
      renewTime: "2020-01-01T00:00:00.000000Z",
      acquireTime: "2020-01-01T00:00:00.000000Z",
      leaseTransitions: 3,
    });
    const leading = new Map<string, boolean>();
    let double = 0;
    const electors = ["a", "b"].map(
      (name) =>
        new LeaseElection({
          api,
          namespace: NAMESPACE,
          name: LEASE,
          identity: name,
          leaseSeconds: 1,
          retryMs: 50,
          log: silentLogger,
          onElected: () => {
            leading.set(name, true);
            if ([...leading.values()].filter(Boolean).length > 1) double++;
          },
          onDemoted: () => leading.set(name, false),
        }),
    );
    for (const elector of electors) elector.start();
    await eventually(async () => (electors.some((e) => e.isLeader) ? true : undefined), "one leads", 5_000);
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(electors.filter((e) => e.isLeader)).toHaveLength(1);
    expect(double).toBe(0);
    expect(fake.lease(NAMESPACE, LEASE)?.spec.leaseTransitions).toBe(4);
    // Force a conflict on the leader's next renewal: it loses that round but keeps the Lease (nobody else took it).
    const leader = electors.find((e) => e.isLeader) as LeaseElection;
    const demotions = [...leading.entries()];
    let bumped = false;
    fake.beforeLeaseUpdate = (current) => {
      if (bumped) return;
      bumped = true;
      current.metadata.resourceVersion = String(Number(current.metadata.resourceVersion) + 1000);
    };
    await eventually(async () => (fake.requests.some((r) => r.status === 409) ? true : undefined), "a 409");
    await new Promise((resolve) => setTimeout(resolve, 500));
    // One lost write is not a lost Lease: the leader keeps leading (it retries until its renew deadline).
    expect(leader.isLeader).toBe(true);
    expect([...leading.entries()]).toEqual(demotions);
    expect(double).toBe(0);
    for (const elector of electors) await elector.stop();
    expect(leader.isLeader).toBe(false);
  });
});
