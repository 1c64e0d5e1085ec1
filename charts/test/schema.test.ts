import { beforeAll, describe, expect, it } from "vitest";
import { ensureHelm, helm } from "./helm.js";
import { templateArgs } from "./manifests.js";

beforeAll(async () => {
  await ensureHelm();
}, 600_000);

/** [what is wrong, --set flags, a phrase helm's error must contain]. */
const BAD_VALUES: readonly [string, readonly string[], string][] = [
  ["an unknown top-level key (a typo)", ["replicas=3"], "replicas"],
  ["an unknown key inside a component", ["api.replica=3"], "replica"],
  ["a port out of range", ["api.port=70000"], "api.port"],
  ["port 0 (a random port cannot be a Service target)", ["proxy.port=0"], "proxy.port"],
  ["a token secret shorter than 16 characters", ["secrets.tokenSecret=short"], "tokenSecret"],
  ["an admin token shorter than 16 characters", ["secrets.adminToken=0123456789"], "adminToken"],
  ["an invalid PostgreSQL schema name", ["database.schema=Warren-Prod"], "database.schema"],
  ["synchronous commit other than on/off", ["database.synchronousCommit=local"], "synchronousCommit"],
  ["external PostgreSQL without a URL or Secret", ["postgresql.enabled=false"], "externalDatabase"],
  ["external Redis without a URL or Secret", ["redis.enabled=false"], "externalRedis"],
  ["a database URL that is not postgres://", ["postgresql.enabled=false", "externalDatabase.url=mysql://db/x"], "url"],
  ["a Redis password that breaks the URL", ["redis.auth.password=p@ss/word"], "password"],
  ["a domain that is not a host name", ["domain=Sandboxes_Example"], "domain"],
  ["a proxy kind that does not exist", ["proxy.kind=StatefulSet"], "proxy.kind"],
  ["zero proxy workers", ["proxy.workers=0"], "workers"],
  ["proxy workers that are neither a number nor auto", ["proxy.workers=many"], "workers"],
  ["a route cache TTL above the proxy's limit", ["proxy.routeCacheTtlMs=3600001"], "routeCacheTtlMs"],
  ["an idle timeout below the proxy's limit", ["proxy.idleTimeoutMs=999"], "idleTimeoutMs"],
  ["a sandbox domain that is not a host name", ["proxy.domains={Bad_Domain}"], "domains"],
  ["proxy TLS without its Secret", ["proxy.tls.enabled=true"], "secretName"],
  ["Ingress TLS with neither a Secret nor cert-manager", ["domain=a.example", "ingress.tls.enabled=true"], "tls"],
  ["a master interval of zero", ["master.evictIntervalMs=0"], "evictIntervalMs"],
  ["a negative memory overcommit", ["master.memoryOvercommit=-1"], "memoryOvercommit"],
  ["a node agent instance tag longer than 4 characters", ["nodeAgent.instance=agent"], "instance"],
  ["a node id with upper case", ["nodeAgent.nodeId=Node1"], "nodeId"],
  ["a sandbox network that is not a CIDR", ["nodeAgent.netCidr=10.201.0.0"], "netCidr"],
  ["a uid base inside the host's own range", ["nodeAgent.uidBase=1000"], "uidBase"],
  ["a heartbeat faster than the agent allows", ["nodeAgent.heartbeatMs=50"], "heartbeatMs"],
  ["a pool size above the agent's limit", ["nodeAgent.poolSize=101"], "poolSize"],
  ["an unknown log level", ["nodeAgent.logLevel=verbose"], "logLevel"],
  ["a leader Lease of zero seconds", ["master.kubernetesApi.leaseSeconds=0"], "leaseSeconds"],
  [
    "a leader Lease shorter than 3 leader intervals (the master refuses it)",
    ["master.kubernetesApi.leaseSeconds=5", "master.leaderIntervalMs=2000"],
    "leaseSeconds",
  ],
  ["a drain taint key with a space", ["master.kubernetesApi.drainTaints={bad key}"], "drainTaints"],
  ["a relative state directory", ["nodeAgent.stateDir=var/lib/warren"], "stateDir"],
  ["a boolean given as a string", ["nodeAgent.killOnStop=yes"], "killOnStop"],
  ["an unknown image pull policy", ["image.pullPolicy=Sometimes"], "pullPolicy"],
  ["a NetworkPolicy source that is not a CIDR", ["networkPolicy.sandboxNodeCIDRs={10.0.0.1}"], "sandboxNodeCIDRs"],
  ["an extra env entry without a name", ["api.extraEnv[0].value=x"], "name"],
];

describe("values.schema.json", () => {
  it.each(BAD_VALUES)("makes helm template fail on %s", async (_what, sets, phrase) => {
    const result = await helm(templateArgs(undefined, sets));
    expect(result.code, `helm template --set ${sets.join(" --set ")} should fail`).not.toBe(0);
    expect(result.stderr).toContain(phrase);
  });

  it("accepts the documented shapes next to those it rejects", async () => {
    const good = [
      "proxy.workers=auto",
      "proxy.workers=4",
      "json:master.memoryOvercommit=1.5",
      "postgresql.enabled=false",
      "externalDatabase.url=postgresql://warren@db:5432/warren",
      "redis.enabled=false",
      "externalRedis.existingSecret=redis-url",
      "api.podDisruptionBudget.maxUnavailable=50%",
      "domain=sandboxes.example.com",
      "ingress.tls.enabled=true",
      "ingress.tls.certManager.issuer=letsencrypt",
    ];
    const result = await helm(templateArgs(undefined, good));
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('WARREN_MEMORY_OVERCOMMIT: "1.5"');
  });
});
