import type { Instance, InstanceSpec, SandboxResources } from "../driver.js";
import { CLOSED_EGRESS, type EgressPolicy } from "../egress/policy.js";
import { InstanceRecordFiles, instanceOf } from "../instance-record-files.js";
import type { CriuExternalFiles } from "./criu.js";
import type { LayeredSnapshot } from "./layer-store.js";
import type { NetworkSlot } from "./network.js";

/** What the driver keeps of an instance, in `<stateDir>/instances/<id>/instance.json` (reconcile reads it back). */
export interface InstanceRecord {
  instanceId: string;
  templateId: string;
  templateHash: string;
  /** The template's rootfs. */
  lowerDir: string;
  /** Snapshot layers stacked above it, topmost first (an instance made from a snapshot). */
  layers?: string[];
  /**
   * The whole layer stack of this instance's last snapshot, topmost first: the next capture writes only what
   * changed since, above it (layer-store.ts `incremental`); kept while the instance lives.
   */
  captureLayers?: string[];
  allowSetuid: boolean;
  /** Runs the code gateway next to envd (ready only when both answer). */
  codeGateway?: boolean;
  /** Team volumes bound read-write (idmapped) into the sandbox. */
  volumes?: { source: string; destination: string }[];
  slot: number;
  addr: string;
  resources: SandboxResources;
  createdAt: number;
  labels: Record<string, string>;
  /** Egress policy in force (re-applied after an agent restart: the gateway's ports change). */
  egress?: EgressPolicy;
  pid?: number;
  pidStartTime?: string;
  paused: boolean;
  /** Paused with its processes ended (filesystem-only pause): the next start is a reboot. */
  stopped?: boolean;
  /** Set while the instance is checkpointed to `<dir>/checkpoint` (no process runs). */
  checkpoint?: CriuExternalFiles;
}

/** This driver's instance directories and records (instance-record-files.ts). */
export class InstanceRecords extends InstanceRecordFiles<InstanceRecord> {}

export function toInstance(record: InstanceRecord): Instance {
  return instanceOf(record, record.checkpoint !== undefined);
}

/** A new instance's record, before anything of it exists: on `slot`, over `base`'s layers when made from one. */
export function newInstanceRecord(
  instanceId: string,
  spec: InstanceSpec,
  slot: NetworkSlot,
  base: LayeredSnapshot | undefined,
): InstanceRecord {
  return {
    instanceId,
    templateId: spec.template.templateId,
    templateHash: spec.template.hash,
    lowerDir: spec.template.rootfs,
    ...(base ? { layers: [...base.layers] } : {}),
    allowSetuid: spec.template.allowSetuid,
    codeGateway: spec.template.codeGateway === true,
    slot: slot.index,
    addr: slot.sandboxAddr,
    resources: spec.resources,
    createdAt: Date.now(),
    labels: { ...spec.labels },
    egress: spec.egress ?? CLOSED_EGRESS,
    ...(spec.volumes?.length ? { volumes: spec.volumes.map((v) => ({ ...v })) } : {}),
    paused: false,
  };
}
