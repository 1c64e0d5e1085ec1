import type { ConnectRouter, ServiceImpl } from "@connectrpc/connect";
import { MasterService } from "@warren/proto/master/v1/master_pb";
import { MasterError, toConnectError } from "./errors.js";
import type { ExecPolicies } from "./exec-policies.js";
import type { SandboxLifecycle } from "./lifecycle.js";
import { createNetworkOf, createVolumeMountsOf, execPolicyJsonOf, updatedEgressOf } from "./master-messages.js";
import type { SandboxMetricsSampler } from "./metrics-sampler.js";
import type { SandboxExport } from "./sandbox-export.js";
import { FORK_DEFAULT_TIMEOUT_SECONDS, FORK_MAX_COUNT, type SnapshotService } from "./snapshots.js";
import type { TemplateBuilder } from "./templates/template-builder.js";

async function guarded<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw toConnectError(error);
  }
}

/** `warren.master.v1.MasterService`: a thin shell; the state machine is SandboxLifecycle. */
export function masterServiceImpl(
  lifecycle: SandboxLifecycle,
  metrics: SandboxMetricsSampler,
  snapshots: SnapshotService,
  builder: TemplateBuilder,
  exporter?: SandboxExport,
  execPolicies?: ExecPolicies,
): ServiceImpl<typeof MasterService> {
  return {
    setExecPolicy: (req) =>
      guarded(async () => {
        if (!execPolicies) throw new MasterError("unimplemented", "this master keeps no exec policies");
        await execPolicies.set(req.teamId, execPolicyJsonOf(req));
        return {};
      }),
    async *exportSandboxPath(req, context) {
      if (!exporter)
        throw toConnectError(new MasterError("unimplemented", "this master does not export sandbox paths"));
      try {
        for await (const event of exporter.export(
          req.teamId,
          req.sandboxId,
          req.path,
          Number(req.maxBytes),
          context.signal,
        )) {
          yield event.kind === "chunk"
            ? { event: { case: "chunk" as const, value: event.data } }
            : { event: { case: "done" as const, value: BigInt(event.size) } };
        }
      } catch (error) {
        throw toConnectError(error);
      }
    },
    startTemplateBuild: (req) =>
      guarded(async () => {
        await builder.start(
          req.teamId,
          req.templateId,
          req.buildId,
          req.registryUsername ? { username: req.registryUsername, password: req.registryPassword } : undefined,
        );
        return {};
      }),
    createSandbox: (req) =>
      guarded(async () => {
        const volumeMounts = createVolumeMountsOf(req);
        const result = await lifecycle.create({
          teamId: req.teamId,
          templateId: req.templateId,
          timeoutSeconds: req.timeoutSeconds,
          metadata: { ...req.metadata },
          envVars: { ...req.envVars },
          autoPause: req.lifecycle?.autoPause ?? false,
          autoPauseMemory: req.lifecycle?.autoPauseMemory ?? true,
          autoResume: req.lifecycle?.autoResume ?? false,
          network: createNetworkOf(req),
          allowInternetAccess: req.allowInternetAccess ?? null,
          volumeMounts,
          mcpServers: [...req.mcpServers],
          ...(req.idempotencyKey ? { idempotencyKey: req.idempotencyKey, requestHash: req.requestHash } : {}),
        });
        return { sandbox: result.sandbox, replayed: result.replayed };
      }),
    connectSandbox: (req) =>
      guarded(async () => {
        const result = await lifecycle.connect(req.sandboxId, req.teamId, req.timeoutSeconds, req.memory);
        return { sandbox: result.sandbox, resumed: result.resumed };
      }),
    killSandbox: (req) =>
      guarded(async () => {
        await lifecycle.kill(req.sandboxId, req.teamId);
        return {};
      }),
    setSandboxTimeout: (req) =>
      guarded(async () => {
        const { endAt } = await lifecycle.setTimeout(req.sandboxId, req.teamId, req.timeoutSeconds, req.extendOnly);
        return { endAt: endAt.toISOString() };
      }),
    getSandboxMetrics: (req) =>
      guarded(async () => ({
        metrics: (await metrics.sample(req.sandboxId, req.teamId)).map((m) => ({
          timestampMs: BigInt(m.timestampMs),
          cpuCount: m.cpuCount,
          cpuUsedPct: m.cpuUsedPct,
          memUsed: BigInt(m.memUsed),
          memTotal: BigInt(m.memTotal),
          diskUsed: BigInt(m.diskUsed),
          diskTotal: BigInt(m.diskTotal),
        })),
      })),
    getSandboxLogs: (req) =>
      guarded(async () => ({
        lines: (await lifecycle.logs(req.sandboxId, req.teamId, Math.min(req.limit || 1000, 10_000))).map((line) => ({
          timestampMs: BigInt(line.timestampMs),
          level: line.level,
          message: line.message,
          fields: { ...line.fields },
        })),
      })),
    updateSandboxNetwork: (req) =>
      guarded(async () => {
        await lifecycle.updateNetwork(req.sandboxId, req.teamId, updatedEgressOf(req), req.allowInternetAccess ?? null);
        return {};
      }),
    pauseSandbox: (req) =>
      guarded(async () => {
        await lifecycle.pause(req.sandboxId, req.teamId, req.memory ?? true);
        return {};
      }),
    createSnapshot: (req) =>
      guarded(async () => {
        const snapshot = await snapshots.createSnapshot(
          req.teamId,
          req.sandboxId,
          req.name || undefined,
          req.memory ?? true,
        );
        return { snapshot: { ...snapshot, sizeBytes: BigInt(snapshot.sizeBytes) } };
      }),
    deleteSnapshot: (req) =>
      guarded(async () => {
        await snapshots.deleteSnapshot(req.teamId, req.snapshotRef);
        return {};
      }),
    forkSandbox: (req) =>
      guarded(async () => {
        const count = req.count === 0 ? 1 : req.count;
        if (count < 1 || count > FORK_MAX_COUNT) {
          throw new MasterError("invalid", `count must be between 1 and ${FORK_MAX_COUNT}, got ${req.count}`);
        }
        if (req.timeoutSeconds < 0) throw new MasterError("invalid", "timeout must not be negative");
        const timeout = req.timeoutSeconds || FORK_DEFAULT_TIMEOUT_SECONDS;
        const { results, memory } = await snapshots.fork(req.teamId, req.sandboxId, count, timeout);
        return {
          memory,
          results: results.map((r) =>
            r.sandbox
              ? { sandbox: r.sandbox }
              : { errorCode: r.error?.code ?? 500, errorMessage: r.error?.message ?? "fork failed" },
          ),
        };
      }),
    resumeOnTraffic: (req) =>
      guarded(async () =>
        lifecycle.resumeOnTraffic({
          sandboxId: req.sandboxId,
          port: req.port,
          trafficAccessToken: req.trafficAccessToken,
          envdAccessToken: req.envdAccessToken,
        }),
      ),
  };
}

export function masterRoutes(
  lifecycle: SandboxLifecycle,
  metrics: SandboxMetricsSampler,
  snapshots: SnapshotService,
  builder: TemplateBuilder,
  exporter?: SandboxExport,
  execPolicies?: ExecPolicies,
): (router: ConnectRouter) => void {
  return (router) => {
    router.service(MasterService, masterServiceImpl(lifecycle, metrics, snapshots, builder, exporter, execPolicies));
  };
}
