/**
 * Every Kubernetes API call the master makes, as RBAC rules. The chart's Role and ClusterRole grant exactly these
 * (checked by charts/test/chart.test.ts), and the master's tests check every request it sends is one of them.
 */
export interface AccessRule {
  readonly apiGroup: string;
  readonly resource: string;
  readonly verbs: readonly string[];
  /** Namespaced rules are granted by a Role in the release's namespace; the others by a ClusterRole. */
  readonly scope: "namespace" | "cluster";
  /** The rule is limited to the leader Lease (resourceNames); `create` cannot be limited by name. */
  readonly onlyTheLease?: boolean;
}

export const KUBERNETES_ACCESS: readonly AccessRule[] = [
  // The node agent pods (label selector): list, then watch.
  { apiGroup: "", resource: "pods", verbs: ["list", "watch"], scope: "namespace" },
  // Leader election: read and renew the one Lease; create it the first time.
  {
    apiGroup: "coordination.k8s.io",
    resource: "leases",
    verbs: ["get", "update"],
    scope: "namespace",
    onlyTheLease: true,
  },
  { apiGroup: "coordination.k8s.io", resource: "leases", verbs: ["create"], scope: "namespace" },
  // Cordon, NotReady and drain taints: observed, never changed.
  { apiGroup: "", resource: "nodes", verbs: ["list", "watch"], scope: "cluster" },
];
