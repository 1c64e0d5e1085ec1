import type { ExecAction, ExecPolicy, ExecRule, FileOp } from "@warren/proto/exec-policy";
import type {
  CreateSandboxRequest,
  ExecAction as ExecActionMessage,
  ExecPolicy as ExecPolicyMessage,
  FileOp as FileOpMessage,
  SandboxNetworkConfig,
  SetExecPolicyRequest,
  UpdateSandboxNetworkRequest,
} from "@warren/proto/master/v1/master_pb";
import {
  EXEC_ACTIONS as ACTIONS,
  FILE_OPS,
  type NetworkConfig,
  type ResolvedVolumeMount,
} from "@warren/proto/master-requests";
import { MasterError } from "./errors.js";

/**
 * The typed fields of `warren.master.v1` requests as the values the master works with: the master's side of the
 * contract whose other side, the api's, is `@warren/proto/master-requests`.
 */

/** The network config as E2B's object, with exactly the fields the request gave. */
export function networkConfigFromMessage(message: SandboxNetworkConfig): NetworkConfig {
  return {
    ...(message.allowOut ? { allowOut: [...message.allowOut.addresses] } : {}),
    ...(message.denyOut ? { denyOut: [...message.denyOut.addresses] } : {}),
    ...(message.allowPublicTraffic !== undefined ? { allowPublicTraffic: message.allowPublicTraffic } : {}),
    ...(message.maskRequestHost !== undefined ? { maskRequestHost: message.maskRequestHost } : {}),
  };
}

/** A create's network config; null when the request had none. */
export function createNetworkOf(req: CreateSandboxRequest): NetworkConfig | null {
  return req.network ? networkConfigFromMessage(req.network) : null;
}

/** A create's volume mounts, as the sandbox row keeps them. */
export function createVolumeMountsOf(req: CreateSandboxRequest): ResolvedVolumeMount[] {
  return req.volumeMounts.map((m): ResolvedVolumeMount => ({ name: m.name, path: m.path, volumeId: m.volumeId }));
}

/** A network update's allowOut and denyOut (a list not given is empty). */
export function updatedEgressOf(req: UpdateSandboxNetworkRequest): NetworkConfig {
  return { allowOut: [...(req.egress?.allowOut ?? [])], denyOut: [...(req.egress?.denyOut ?? [])] };
}

function actionOf(action: ExecActionMessage, field: string): ExecAction {
  const found = (Object.keys(ACTIONS) as ExecAction[]).find((name) => ACTIONS[name] === action);
  if (!found) throw new MasterError("invalid", `${field} must be allow, deny or review`);
  return found;
}

function fileOpOf(op: FileOpMessage, field: string): FileOp {
  const found = (Object.keys(FILE_OPS) as FileOp[]).find((name) => FILE_OPS[name] === op);
  if (!found) throw new MasterError("invalid", `${field} must be write or remove`);
  return found;
}

/** The policy back in `@warren/proto/exec-policy`'s shape, its keys in the order `parseExecPolicy` writes them. */
export function execPolicyFromMessage(message: ExecPolicyMessage): ExecPolicy {
  const rules = message.rules.map((rule, i): ExecRule => {
    const at = `policy.rules[${i}]`;
    return {
      action: actionOf(rule.action, `${at}.action`),
      ...(rule.name !== undefined ? { name: rule.name } : {}),
      ...(rule.command !== undefined ? { command: rule.command } : {}),
      ...(rule.asRoot !== undefined ? { asRoot: rule.asRoot } : {}),
      ...(rule.paths.length > 0 ? { paths: [...rule.paths] } : {}),
      ...(rule.ops.length > 0 ? { ops: rule.ops.map((op, j) => fileOpOf(op, `${at}.ops[${j}]`)) } : {}),
    };
  });
  return {
    rules,
    ...(message.defaultAction !== undefined ? { default: actionOf(message.defaultAction, "policy.default") } : {}),
    ...(message.reviewTtlSeconds !== undefined ? { reviewTtlSeconds: message.reviewTtlSeconds } : {}),
  };
}

/** The policy SetExecPolicy stores, as JSON; "" clears it. */
export function execPolicyJsonOf(req: SetExecPolicyRequest): string {
  return req.policy ? JSON.stringify(execPolicyFromMessage(req.policy)) : "";
}
