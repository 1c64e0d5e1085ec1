/**
 * A small fake Kubernetes API server for the master's Kubernetes integration: the few endpoints the master calls,
 * answering with objects shaped like a real API server's (v1.30: list kinds and metadata, watch event lines,
 * Status bodies for 404/409/400/401, resourceVersion optimistic concurrency on Leases, MicroTime format
 * checks). It is not a cluster: there is no scheduler, kubelet or controller; tests change the objects directly,
 * the way those controllers would (e.g. `cordon` sets spec.unschedulable and adds the unschedulable taint as the
 * node lifecycle controller does).
 */
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { MasterConfig } from "../src/master/config.js";
import { KUBERNETES_ACCESS } from "../src/master/kubernetes/access.js";

// biome-ignore lint/suspicious/noExplicitAny: API objects are untyped JSON here, as on the wire.
export type KubeObject = Record<string, any>;

export interface RecordedRequest {
  readonly listener: number;
  readonly method: string;
  readonly path: string;
  readonly query: Record<string, string>;
  readonly status: number;
  readonly body?: KubeObject;
}

interface WatchStream {
  readonly resource: "pods" | "nodes";
  readonly namespace?: string;
  readonly selector: (labels: Record<string, string>) => boolean;
  readonly res: http.ServerResponse;
}

const TOKEN = "fake-service-account-token";
const MICRO_TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$/;

function status(code: number, reason: string, message: string, details?: KubeObject): KubeObject {
  return {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message,
    reason,
    ...(details ? { details } : {}),
    code,
  };
}

/** `a=b,c=d` and `a!=b` label selectors (the forms the chart renders), as the API server evaluates them. */
function parseSelector(raw: string | undefined): (labels: Record<string, string>) => boolean {
  const terms = (raw ?? "")
    .split(",")
    .map((t) => t.trim())
    .filter(Boolean)
    .map((term) => {
      const neq = term.split("!=");
      if (neq.length === 2) return (l: Record<string, string>) => l[neq[0] as string] !== neq[1];
      const [key, value] = term.split(/==?/) as [string, string | undefined];
      return value === undefined
        ? (l: Record<string, string>) => key in l
        : (l: Record<string, string>) => l[key] === value;
    });
  return (labels) => terms.every((match) => match(labels));
}

export class FakeKubernetesApi {
  readonly requests: RecordedRequest[] = [];
  private resourceVersion = 1000;
  private readonly pods = new Map<string, KubeObject>(); // key: namespace/name
  private readonly nodes = new Map<string, KubeObject>();
  private readonly leases = new Map<string, KubeObject>();
  private readonly watches = new Set<WatchStream>();
  /** Every pod/node event, for watches that resume from a resourceVersion; `compact` drops the old ones. */
  private history: { resource: "pods" | "nodes"; type: string; object: KubeObject; rv: number }[] = [];
  private compactedBelow = 0;
  private readonly servers: http.Server[] = [];
  /** The kubeconfig files' folders, removed on close. */
  private readonly kubeconfigDirs: string[] = [];
  /** Per listener: answer nothing (a partition: requests hang until unblocked). */
  private readonly blocked = new Set<number>();
  private readonly held: (() => void)[] = [];
  /** Called before a Lease update is applied, e.g. to let another writer change it first (409). */
  beforeLeaseUpdate: ((lease: KubeObject) => void) | undefined;

  /** Starts one more listener on 127.0.0.1 sharing this state; returns its index. */
  async listen(): Promise<number> {
    const index = this.servers.length;
    const server = http.createServer((req, res) => this.handle(index, req, res));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    this.servers.push(server);
    return index;
  }

  url(listener = 0): string {
    const server = this.servers[listener];
    if (!server) throw new Error(`no listener ${listener}`);
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  /** A kubeconfig file naming this server (through `listener`) with a bearer token, as kubectl writes them. */
  kubeconfig(listener = 0, namespace = "default", token = TOKEN): string {
    const dir = mkdtempSync(join(tmpdir(), "warren-kubeconfig-"));
    this.kubeconfigDirs.push(dir);
    const file = join(dir, "config");
    writeFileSync(
      file,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: fake",
        "  cluster:",
        `    server: ${this.url(listener)}`,
        // The library refuses plain http unless TLS checks are off; TLS itself is not exercised here.
        "    insecure-skip-tls-verify: true",
        "users:",
        "- name: warren-master",
        "  user:",
        `    token: ${token}`,
        "contexts:",
        "- name: fake",
        "  context:",
        "    cluster: fake",
        "    user: warren-master",
        `    namespace: ${namespace}`,
        "current-context: fake",
        "",
      ].join("\n"),
    );
    return file;
  }

  block(listener: number): void {
    this.blocked.add(listener);
  }

  unblock(listener: number): void {
    this.blocked.delete(listener);
    for (const release of this.held.splice(0)) release();
  }

  async close(): Promise<void> {
    for (const dir of this.kubeconfigDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
    for (const release of this.held.splice(0)) release();
    for (const watch of this.watches) watch.res.end();
    this.watches.clear();
    await Promise.all(
      this.servers.map(
        (server) =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeAllConnections();
          }),
      ),
    );
  }

  /** Ends every open watch, as an API server does at its watch timeout; informers must watch again. */
  endWatches(): void {
    for (const watch of this.watches) watch.res.end();
    this.watches.clear();
  }

  private nextVersion(): string {
    return String(++this.resourceVersion);
  }

  // Objects, shaped like `kubectl get -o json` of a kind/kubeadm cluster (trimmed of managedFields).

  addNode(name: string): KubeObject {
    const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
    const node: KubeObject = {
      kind: "Node",
      apiVersion: "v1",
      metadata: {
        name,
        uid: randomUUID(),
        resourceVersion: this.nextVersion(),
        creationTimestamp: now,
        labels: {
          "beta.kubernetes.io/arch": "amd64",
          "beta.kubernetes.io/os": "linux",
          "kubernetes.io/arch": "amd64",
          "kubernetes.io/hostname": name,
          "kubernetes.io/os": "linux",
          "warren.dev/sandbox-node": "true",
        },
        annotations: {
          "node.alpha.kubernetes.io/ttl": "0",
          "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        },
      },
      spec: { podCIDR: "10.244.1.0/24", podCIDRs: ["10.244.1.0/24"], providerID: `kind://docker/kind/${name}` },
      status: {
        capacity: { cpu: "8", "ephemeral-storage": "102626232Ki", memory: "32803148Ki", pods: "110" },
        allocatable: { cpu: "8", "ephemeral-storage": "102626232Ki", memory: "32803148Ki", pods: "110" },
        conditions: [
          this.condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
          ),
          this.condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
          this.condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
          this.condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        addresses: [
          { type: "InternalIP", address: `172.18.0.${10 + this.nodes.size}` },
          { type: "Hostname", address: name },
        ],
        daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
        nodeInfo: {
          architecture: "amd64",
          containerRuntimeVersion: "containerd://1.7.15",
          kernelVersion: "6.1.0-18-amd64",
          kubeProxyVersion: "v1.30.0",
          kubeletVersion: "v1.30.0",
          operatingSystem: "linux",
          osImage: "Debian GNU/Linux 12 (bookworm)",
        },
      },
    };
    this.nodes.set(name, node);
    this.emit("nodes", "ADDED", node);
    return node;
  }

  private condition(type: string, statusValue: string, reason: string, message: string): KubeObject {
    const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
    return {
      type,
      status: statusValue,
      lastHeartbeatTime: now,
      lastTransitionTime: now,
      reason,
      message,
    };
  }

  /** A node agent pod of the chart's DaemonSet on `nodeName` (hostNetwork: pod IP = host IP). */
  addAgentPod(
    namespace: string,
    name: string,
    nodeName: string,
    ip: string,
    labels: Record<string, string>,
    port = 49700,
  ): KubeObject {
    const now = new Date().toISOString().replace(/\.\d+Z$/, "Z");
    const pod: KubeObject = {
      kind: "Pod",
      apiVersion: "v1",
      metadata: {
        name,
        generateName: `${name.replace(/-[a-z0-9]+$/, "")}-`,
        namespace,
        uid: randomUUID(),
        resourceVersion: this.nextVersion(),
        creationTimestamp: now,
        labels: { ...labels, "controller-revision-hash": "6d9c7f8b5", "pod-template-generation": "1" },
        ownerReferences: [
          {
            apiVersion: "apps/v1",
            kind: "DaemonSet",
            name: "wr-warren-node-agent",
            uid: randomUUID(),
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
      },
      spec: {
        containers: [
          {
            name: "node-agent",
            image: "warren:0.1.0",
            command: ["node", "control-plane/dist/node-agent/main.js"],
            ports: [{ name: "connect", containerPort: port, hostPort: port, protocol: "TCP" }],
            securityContext: { privileged: true, runAsUser: 0, runAsGroup: 0 },
          },
        ],
        nodeName,
        hostNetwork: true,
        hostPID: true,
        dnsPolicy: "ClusterFirstWithHostNet",
        serviceAccountName: "wr-warren-node-agent",
        tolerations: [
          { key: "node.kubernetes.io/not-ready", operator: "Exists", effect: "NoExecute" },
          { key: "node.kubernetes.io/unreachable", operator: "Exists", effect: "NoExecute" },
          { key: "node.kubernetes.io/unschedulable", operator: "Exists", effect: "NoSchedule" },
        ],
      },
      status: {
        phase: "Running",
        conditions: [
          { type: "PodReadyToStartContainers", status: "True", lastProbeTime: null, lastTransitionTime: now },
          { type: "Initialized", status: "True", lastProbeTime: null, lastTransitionTime: now },
          { type: "Ready", status: "True", lastProbeTime: null, lastTransitionTime: now },
          { type: "ContainersReady", status: "True", lastProbeTime: null, lastTransitionTime: now },
          { type: "PodScheduled", status: "True", lastProbeTime: null, lastTransitionTime: now },
        ],
        hostIP: ip,
        hostIPs: [{ ip }],
        podIP: ip,
        podIPs: [{ ip }],
        startTime: now,
        qosClass: "Burstable",
      },
    };
    this.pods.set(`${namespace}/${name}`, pod);
    this.emit("pods", "ADDED", pod);
    return pod;
  }

  /** Applies `change` to a Node as a controller would: new resourceVersion, MODIFIED event. */
  updateNode(name: string, change: (node: KubeObject) => void): void {
    const node = this.nodes.get(name);
    if (!node) throw new Error(`no node ${name}`);
    change(node);
    node.metadata.resourceVersion = this.nextVersion();
    this.emit("nodes", "MODIFIED", node);
  }

  updatePod(namespace: string, name: string, change: (pod: KubeObject) => void): void {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (!pod) throw new Error(`no pod ${namespace}/${name}`);
    change(pod);
    pod.metadata.resourceVersion = this.nextVersion();
    this.emit("pods", "MODIFIED", pod);
  }

  deletePod(namespace: string, name: string): void {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (!pod) throw new Error(`no pod ${namespace}/${name}`);
    this.pods.delete(`${namespace}/${name}`);
    pod.metadata.resourceVersion = this.nextVersion();
    this.emit("pods", "DELETED", pod);
  }

  /** `kubectl cordon`: spec.unschedulable, plus the taint the node lifecycle controller adds for it. */
  cordon(name: string): void {
    this.updateNode(name, (node) => {
      node.spec.unschedulable = true;
      node.spec.taints = [
        ...(node.spec.taints ?? []),
        { key: "node.kubernetes.io/unschedulable", effect: "NoSchedule", timeAdded: new Date().toISOString() },
      ];
    });
  }

  uncordon(name: string): void {
    this.updateNode(name, (node) => {
      delete node.spec.unschedulable;
      node.spec.taints = (node.spec.taints ?? []).filter(
        (t: KubeObject) => t.key !== "node.kubernetes.io/unschedulable",
      );
      if (node.spec.taints.length === 0) delete node.spec.taints;
    });
  }

  /** The kubelet stops posting status: Ready Unknown, and the controller's unreachable taints. */
  setReady(name: string, ready: boolean): void {
    this.updateNode(name, (node) => {
      const condition = node.status.conditions.find((c: KubeObject) => c.type === "Ready");
      condition.status = ready ? "True" : "Unknown";
      condition.reason = ready ? "KubeletReady" : "NodeStatusUnknown";
      condition.message = ready ? "kubelet is posting ready status" : "Kubelet stopped posting node status.";
      const unreachable = ["node.kubernetes.io/unreachable"];
      const others = (node.spec.taints ?? []).filter((t: KubeObject) => !unreachable.includes(t.key));
      node.spec.taints = ready
        ? others
        : [
            ...others,
            { key: "node.kubernetes.io/unreachable", effect: "NoSchedule" },
            { key: "node.kubernetes.io/unreachable", effect: "NoExecute", timeAdded: new Date().toISOString() },
          ];
      if (node.spec.taints.length === 0) delete node.spec.taints;
    });
  }

  taint(name: string, key: string, effect = "NoSchedule"): void {
    this.updateNode(name, (node) => {
      node.spec.taints = [...(node.spec.taints ?? []), { key, effect }];
    });
  }

  untaint(name: string, key: string): void {
    this.updateNode(name, (node) => {
      node.spec.taints = (node.spec.taints ?? []).filter((t: KubeObject) => t.key !== key);
      if (node.spec.taints.length === 0) delete node.spec.taints;
    });
  }

  lease(namespace: string, name: string): KubeObject | undefined {
    const lease = this.leases.get(`${namespace}/${name}`);
    return lease ? structuredClone(lease) : undefined;
  }

  /** Another writer (e.g. a replica this test does not run) writes the Lease. */
  writeLease(namespace: string, name: string, spec: KubeObject): void {
    const key = `${namespace}/${name}`;
    const existing = this.leases.get(key);
    const lease = existing ?? this.newLease(namespace, name);
    lease.spec = spec;
    lease.metadata.resourceVersion = this.nextVersion();
    this.leases.set(key, lease);
  }

  private newLease(namespace: string, name: string): KubeObject {
    return {
      kind: "Lease",
      apiVersion: "coordination.k8s.io/v1",
      metadata: {
        name,
        namespace,
        uid: randomUUID(),
        resourceVersion: this.nextVersion(),
        creationTimestamp: new Date().toISOString().replace(/\.\d+Z$/, "Z"),
      },
      spec: {},
    };
  }

  /** Forgets history, as etcd compaction does: a watch from an older resourceVersion gets 410 Gone. */
  compact(): void {
    this.history = [];
    this.compactedBelow = this.resourceVersion;
  }

  private emit(resource: "pods" | "nodes", type: string, object: KubeObject): void {
    const copy = structuredClone(object);
    this.history.push({ resource, type, object: copy, rv: Number(object.metadata.resourceVersion) });
    for (const watch of this.watches) this.send(watch, resource, type, copy);
  }

  private send(watch: WatchStream, resource: "pods" | "nodes", type: string, object: KubeObject): void {
    if (watch.resource !== resource) return;
    if (watch.namespace && object.metadata.namespace !== watch.namespace) return;
    if (!watch.selector(object.metadata.labels ?? {})) return;
    watch.res.write(`${JSON.stringify({ type, object })}\n`);
  }

  private handle(listener: number, req: http.IncomingMessage, res: http.ServerResponse): void {
    if (this.blocked.has(listener)) {
      // A partition: the request is held until unblocked, then dropped.
      this.held.push(() => req.socket.destroy());
      return;
    }
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const url = new URL(req.url ?? "/", "http://fake");
      const query = Object.fromEntries(url.searchParams);
      let body: KubeObject | undefined;
      if (chunks.length > 0) body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      const answer = (code: number, object: KubeObject) => {
        this.requests.push({
          listener,
          method: req.method ?? "",
          path: url.pathname,
          query,
          status: code,
          ...(body ? { body } : {}),
        });
        res.writeHead(code, { "Content-Type": "application/json", "Audit-Id": randomUUID() });
        res.end(JSON.stringify(object));
      };
      if (req.headers.authorization !== `Bearer ${TOKEN}`) {
        answer(401, status(401, "Unauthorized", "Unauthorized"));
        return;
      }
      this.route(req.method ?? "GET", url.pathname, query, body, answer, (resource, namespace) => {
        this.requests.push({ listener, method: "WATCH", path: url.pathname, query, status: 200 });
        this.watch(resource, namespace, query, res);
      });
    });
  }

  private route(
    method: string,
    path: string,
    query: Record<string, string>,
    body: KubeObject | undefined,
    answer: (code: number, object: KubeObject) => void,
    watch: (resource: "pods" | "nodes", namespace?: string) => void,
  ): unknown {
    let m = /^\/api\/v1\/namespaces\/([^/]+)\/pods$/.exec(path);
    if (m && method === "GET") {
      if (query.watch === "true") return watch("pods", m[1]);
      const selector = parseSelector(query.labelSelector);
      const items = [...this.pods.values()].filter(
        (p) => p.metadata.namespace === m?.[1] && selector(p.metadata.labels ?? {}),
      );
      return answer(200, this.list("PodList", items));
    }
    if (path === "/api/v1/nodes" && method === "GET") {
      if (query.watch === "true") return watch("nodes");
      return answer(200, this.list("NodeList", [...this.nodes.values()]));
    }
    m = /^\/apis\/coordination\.k8s\.io\/v1\/namespaces\/([^/]+)\/leases(?:\/([^/]+))?$/.exec(path);
    if (m) return this.leaseRequest(method, m[1] as string, m[2], body, answer);
    answer(404, status(404, "NotFound", "the server could not find the requested resource"));
  }

  private list(kind: string, items: KubeObject[]): KubeObject {
    return {
      kind,
      apiVersion: "v1",
      metadata: { resourceVersion: String(this.resourceVersion) },
      // A list's items carry no kind/apiVersion on the wire.
      items: items.map(({ kind: _k, apiVersion: _a, ...rest }) => structuredClone(rest)),
    };
  }

  private watch(
    resource: "pods" | "nodes",
    namespace: string | undefined,
    query: Record<string, string>,
    res: http.ServerResponse,
  ): void {
    res.writeHead(200, { "Content-Type": "application/json", "Transfer-Encoding": "chunked" });
    res.flushHeaders();
    const stream: WatchStream = {
      resource,
      ...(namespace ? { namespace } : {}),
      selector: parseSelector(query.labelSelector),
      res,
    };
    const from = Number(query.resourceVersion || 0);
    if (from > 0 && from < this.compactedBelow) {
      const gone = status(410, "Expired", `too old resource version: ${from} (${this.compactedBelow})`);
      res.end(`${JSON.stringify({ type: "ERROR", object: gone })}\n`);
      return;
    }
    for (const event of this.history) if (event.rv > from) this.send(stream, event.resource, event.type, event.object);
    this.watches.add(stream);
    res.on("close", () => this.watches.delete(stream));
  }

  private leaseRequest(
    method: string,
    namespace: string,
    name: string | undefined,
    body: KubeObject | undefined,
    answer: (code: number, object: KubeObject) => void,
  ): unknown {
    const notFound = (n: string) =>
      status(404, "NotFound", `leases.coordination.k8s.io "${n}" not found`, {
        name: n,
        group: "coordination.k8s.io",
        kind: "leases",
      });
    const invalidTime = (spec: KubeObject | undefined) =>
      ["renewTime", "acquireTime"].find((f) => spec?.[f] !== undefined && !MICRO_TIME.test(String(spec[f])));
    if (method === "GET" && name) {
      const lease = this.leases.get(`${namespace}/${name}`);
      return lease ? answer(200, lease) : answer(404, notFound(name));
    }
    if (method === "POST" && !name && body) {
      const leaseName = body.metadata?.name as string;
      if (this.leases.has(`${namespace}/${leaseName}`)) {
        return answer(
          409,
          status(409, "AlreadyExists", `leases.coordination.k8s.io "${leaseName}" already exists`, {
            name: leaseName,
            group: "coordination.k8s.io",
            kind: "leases",
          }),
        );
      }
      const bad = invalidTime(body.spec);
      if (bad)
        return answer(400, status(400, "BadRequest", `Lease in version "v1" cannot be handled as a Lease: ${bad}`));
      const lease = this.newLease(namespace, leaseName);
      lease.spec = body.spec ?? {};
      this.leases.set(`${namespace}/${leaseName}`, lease);
      return answer(201, lease);
    }
    if (method === "PUT" && name && body) {
      const key = `${namespace}/${name}`;
      const current = this.leases.get(key);
      if (!current) return answer(404, notFound(name));
      this.beforeLeaseUpdate?.(current);
      const bad = invalidTime(body.spec);
      if (bad)
        return answer(400, status(400, "BadRequest", `Lease in version "v1" cannot be handled as a Lease: ${bad}`));
      const given = body.metadata?.resourceVersion;
      // Leases allow unconditional updates (no resourceVersion); the tests check the master never sends one.
      if (given !== undefined && given !== current.metadata.resourceVersion) {
        return answer(
          409,
          status(
            409,
            "Conflict",
            `Operation cannot be fulfilled on leases.coordination.k8s.io "${name}": the object has been modified; please apply your changes to the latest version and try again`,
            { name, group: "coordination.k8s.io", kind: "leases" },
          ),
        );
      }
      current.spec = body.spec ?? {};
      current.metadata.resourceVersion = this.nextVersion();
      return answer(200, current);
    }
    answer(405, status(405, "MethodNotAllowed", `the server does not allow this method on the requested resource`));
  }
}

// The chart's shape: namespace, agent labels, Lease name; and the RBAC check on recorded requests.

export const NAMESPACE = "sandboxes";
export const AGENT_LABELS = {
  "app.kubernetes.io/name": "warren",
  "app.kubernetes.io/instance": "wr",
  "app.kubernetes.io/component": "node-agent",
};
export const SELECTOR = Object.entries(AGENT_LABELS)
  .map(([k, v]) => `${k}=${v}`)
  .join(",");

export function kubernetesConfig(overrides: Partial<NonNullable<MasterConfig["kubernetes"]>> = {}) {
  return {
    mode: "kubeconfig" as const,
    namespace: NAMESPACE,
    agentSelector: SELECTOR,
    agentPort: "connect",
    leaseName: "wr-warren-master",
    leaseSeconds: 1,
    identity: "wr-warren-master-7d9f",
    drainTaints: ["warren.dev/drain", "ToBeDeletedByClusterAutoscaler"],
    ...overrides,
  };
}

/** Whether a recorded request is one the chart's RBAC (KUBERNETES_ACCESS) allows. */
export function allowedByRbac(request: RecordedRequest): boolean {
  const verb =
    request.method === "WATCH"
      ? "watch"
      : request.method === "POST"
        ? "create"
        : request.method === "PUT"
          ? "update"
          : /\/leases\/[^/]+$/.test(request.path)
            ? "get"
            : "list";
  const m = /^\/(?:api\/v1|apis\/([^/]+)\/v1)(?:\/namespaces\/([^/]+))?\/([a-z]+)(?:\/([^/]+))?$/.exec(request.path);
  if (!m) return false;
  const [, group = "", namespace, resource, name] = m;
  return KUBERNETES_ACCESS.some(
    (rule) =>
      rule.apiGroup === group &&
      rule.resource === resource &&
      rule.verbs.includes(verb) &&
      (rule.scope === "cluster" ? namespace === undefined : namespace === NAMESPACE) &&
      (!rule.onlyTheLease || name === "wr-warren-master"),
  );
}
