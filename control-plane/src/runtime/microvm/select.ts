import type { Logger } from "@warren/platform/log";
import { sandboxLogCap } from "../log-cap.js";
import { MicrovmDriver } from "./driver.js";
import { ensureKernel } from "./guest-image.js";
import { type DriverRequest, decideDriver, hostFacts, kvmBootTest, type ProbeResult } from "./probe.js";

/** The node settings the choice of driver and the microvm driver need (the node agent's config has them all). */
export interface RuntimeSelectionConfig {
  readonly driver: DriverRequest;
  readonly microvmDir: string;
  readonly microvmKernel: string;
  readonly microvmBootTimeoutMs: number;
  readonly microvmRamFile: boolean;
  readonly nodeBinary: string;
  readonly envdRoot: string;
  readonly uidBase: number;
  readonly stateDir: string;
  readonly instance: string;
  readonly netCidr: string;
  readonly readyTimeoutMs: number;
  readonly dnsUpstream: string | undefined;
  readonly uplinkForwarding: boolean;
  readonly sandboxLogMaxBytes: number;
}

export interface RuntimeSelection {
  readonly probe: ProbeResult;
  /** The microvm driver when the probe chose it; undefined means the namespace driver. */
  readonly microvm?: MicrovmDriver;
}

/** Runs the capability probe for this node's config, logs its reasoning, and builds the microvm driver if chosen. */
export async function selectRuntime(config: RuntimeSelectionConfig, log: Logger): Promise<RuntimeSelection> {
  const imageOptions = {
    dir: config.microvmDir,
    linuxDir: config.microvmKernel,
    busybox: "/bin/busybox",
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    uidBase: config.uidBase,
  };
  const probe = await decideDriver(config.driver, hostFacts(config.microvmKernel), async () =>
    kvmBootTest(await ensureKernel(imageOptions), config.microvmDir),
  );
  log.info("runtime driver chosen by the capability probe", {
    requested: config.driver,
    driver: probe.driver,
    reasons: probe.reasons,
  });
  if (probe.driver === "namespace") return { probe };
  const microvm = new MicrovmDriver({
    stateDir: config.stateDir,
    instance: config.instance,
    netCidr: config.netCidr,
    accel: probe.driver === "microvm" ? "kvm" : "tcg",
    imageDir: config.microvmDir,
    linuxDir: config.microvmKernel,
    nodeBinary: config.nodeBinary,
    envdRoot: config.envdRoot,
    uidBase: config.uidBase,
    // A restore under TCG on a busy machine takes seconds, not the namespace driver's milliseconds.
    readyTimeoutMs: probe.driver === "microvm" ? config.readyTimeoutMs : Math.max(config.readyTimeoutMs, 120_000),
    ...(config.microvmBootTimeoutMs > 0 ? { bootTimeoutMs: config.microvmBootTimeoutMs } : {}),
    ...(config.dnsUpstream ? { dnsUpstream: config.dnsUpstream } : {}),
    uplinkForwarding: config.uplinkForwarding,
    templateRamFile: config.microvmRamFile,
    logCap: sandboxLogCap(config.sandboxLogMaxBytes),
    log: log.child({ part: "driver" }),
  });
  return { probe, microvm };
}
