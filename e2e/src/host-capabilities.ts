import { readFileSync } from "node:fs";

/**
 * Whether the checkpoint tier works on this host: the node agent's CRIU probe verdict
 * (control-plane/src/runtime/namespace/criu-probe.ts), written next to the CRIU wrapper when an agent starts.
 * Tests of pausing assert the deep tier where CRIU works and the freezer fallback where it does not (e.g. a PVM
 * guest whose kernel breaks CRIU's parasite); either way they assert what the host really does.
 */
export function checkpointTier(criuProbeFile = "/var/lib/warren/criu/probe.json"): { usable: boolean; reason: string } {
  try {
    const verdict = JSON.parse(readFileSync(criuProbeFile, "utf8")) as { usable?: unknown; reason?: unknown };
    return { usable: verdict.usable === true, reason: String(verdict.reason ?? "") };
  } catch {
    return { usable: false, reason: `no CRIU probe verdict at ${criuProbeFile}` };
  }
}
