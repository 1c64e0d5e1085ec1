import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  ExecAction as ExecActionMessage,
  type ExecPolicySchema,
  FileOp as FileOpMessage,
  type SandboxNetworkConfigSchema,
  type VolumeMountSchema,
} from "../gen/master/v1/master_pb.js";
import type { ExecAction, ExecPolicy, FileOp } from "./exec-policy.js";

/**
 * The typed fields of `warren.master.v1` requests, built from the values the api validated: the api's side of the
 * master's contract (`@warren/proto/master-requests`). The master reads them back in its `master-messages.ts`.
 */

/** E2B's SandboxNetworkConfig object, as the api validated it and the sandbox row keeps it. */
export type NetworkConfig = Record<string, unknown>;

/** A team volume as the api resolved it and the sandbox row keeps it. */
export interface ResolvedVolumeMount {
  readonly name: string;
  readonly path: string;
  readonly volumeId: string;
}

function stringList(value: unknown): string[] | undefined {
  return Array.isArray(value) && value.every((entry) => typeof entry === "string") ? value : undefined;
}

/** E2B's SandboxNetworkConfig (as the api validated it) as the request message; undefined when there is none. */
export function networkConfigToMessage(
  network: Readonly<NetworkConfig> | null | undefined,
): MessageInitShape<typeof SandboxNetworkConfigSchema> | undefined {
  if (!network) return undefined;
  const allowOut = stringList(network.allowOut);
  const denyOut = stringList(network.denyOut);
  return {
    ...(allowOut ? { allowOut: { addresses: allowOut } } : {}),
    ...(denyOut ? { denyOut: { addresses: denyOut } } : {}),
    ...(typeof network.allowPublicTraffic === "boolean" ? { allowPublicTraffic: network.allowPublicTraffic } : {}),
    ...(typeof network.maskRequestHost === "string" ? { maskRequestHost: network.maskRequestHost } : {}),
  };
}

/** The team volumes a create mounts, as the api resolved them. */
export function volumeMountsToMessage(
  mounts: readonly ResolvedVolumeMount[],
): MessageInitShape<typeof VolumeMountSchema>[] {
  return mounts.map((m) => ({ name: m.name, path: m.path, volumeId: m.volumeId }));
}

/** Exec policy actions and file operations and their enum values in `warren.master.v1`. */
export const EXEC_ACTIONS: Readonly<Record<ExecAction, ExecActionMessage>> = {
  allow: ExecActionMessage.ALLOW,
  deny: ExecActionMessage.DENY,
  review: ExecActionMessage.REVIEW,
};
export const FILE_OPS: Readonly<Record<FileOp, FileOpMessage>> = {
  write: FileOpMessage.WRITE,
  remove: FileOpMessage.REMOVE,
};

/** A policy the api validated (`parseExecPolicy`) as the request message. */
export function execPolicyToMessage(policy: ExecPolicy): MessageInitShape<typeof ExecPolicySchema> {
  return {
    rules: policy.rules.map((rule) => ({
      action: EXEC_ACTIONS[rule.action],
      ...(rule.name !== undefined ? { name: rule.name } : {}),
      ...(rule.command !== undefined ? { command: rule.command } : {}),
      ...(rule.asRoot !== undefined ? { asRoot: rule.asRoot } : {}),
      paths: [...(rule.paths ?? [])],
      ops: (rule.ops ?? []).map((op) => FILE_OPS[op]),
    })),
    ...(policy.default !== undefined ? { defaultAction: EXEC_ACTIONS[policy.default] } : {}),
    ...(policy.reviewTtlSeconds !== undefined ? { reviewTtlSeconds: policy.reviewTtlSeconds } : {}),
  };
}
