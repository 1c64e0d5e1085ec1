import type { Instance, SandboxResources } from "../driver.js";
import type { EgressPolicy } from "../egress/policy.js";
import { InstanceRecordFiles, instanceOf } from "../instance-record-files.js";

/** What the driver keeps of an instance, in `<stateDir>/instances/<id>/instance.json` (reconcile reads it back). */
export interface InstanceRecord {
  instanceId: string;
  templateId: string;
  templateHash: string;
  /** Template snapshot this instance was restored from (its disk is the instance disk's backing file). */
  snapshotDir?: string;
  /** Runs the code gateway next to envd (ready only when both answer). */
  codeGateway?: boolean;
  slot: number;
  addr: string;
  resources: SandboxResources;
  vcpus: number;
  createdAt: number;
  labels: Record<string, string>;
  /** Egress policy in force (re-applied after an agent restart: the gateway's ports change). */
  egress?: EgressPolicy;
  pid?: number;
  pidStartTime?: string;
  paused: boolean;
  /** Memory saved to `<dir>/memory.snap`, no QEMU running. */
  checkpointed?: boolean;
  /** QEMU ended, disk kept (filesystem-only pause): the next start is a reboot. */
  stopped?: boolean;
  /**
   * Paused, and `<dir>/memory.paused` holds exactly its memory: a snapshot taken while paused left QEMU in
   * `postmigrate`, where QEMU 7.2 cannot migrate again; checkpoint and further snapshots use this file instead.
   */
  pausedImage?: boolean;
  /** The sandbox snapshot this instance was created from: its disk is the instance disk's backing file. */
  fromSnapshot?: string;
}

/** This driver's instance directories and records (instance-record-files.ts). */
export class InstanceRecords extends InstanceRecordFiles<InstanceRecord> {}

export function toInstance(record: InstanceRecord): Instance {
  return instanceOf(record, record.checkpointed === true);
}
