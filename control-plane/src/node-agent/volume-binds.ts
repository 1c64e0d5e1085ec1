import { stat } from "node:fs/promises";
import { join } from "node:path";
import type { RuntimeDriver } from "../runtime/driver.js";
import { mountVolumeImage } from "../runtime/volume-images.js";
import { AgentError } from "./errors.js";
import type { CreateSandboxInput } from "./sandbox-model.js";

/**
 * The host folders of the create's volumes. Each must exist already (the api makes it when the volume is
 * created): a missing one means this node does not share the api's WARREN_VOLUMES_DIR, or the volume was deleted.
 * An image volume's folder is its filesystem's mount point, mounted first if it is not (after a reboot).
 */
export async function volumeBinds(
  input: Pick<CreateSandboxInput, "teamId" | "volumeMounts">,
  volumesDir: string,
  driver: Pick<RuntimeDriver, "name" | "mountsVolumes">,
): Promise<{ source: string; destination: string }[]> {
  const binds: { source: string; destination: string }[] = [];
  if (input.volumeMounts?.length && !driver.mountsVolumes) {
    throw new AgentError("unimplemented", `the ${driver.name} driver cannot mount volumes`);
  }
  for (const mount of input.volumeMounts ?? []) {
    if (!/^[0-9a-f-]{36}$/.test(mount.volumeId) || !/^[A-Za-z0-9_-]+$/.test(input.teamId)) {
      throw new AgentError("invalid_argument", `invalid volume mount '${mount.volumeId}' of team '${input.teamId}'`);
    }
    if (!mount.path.startsWith("/") || mount.path.split("/").some((p) => p === "." || p === "..")) {
      throw new AgentError("invalid_argument", `volume mount path must be absolute and clean, got '${mount.path}'`);
    }
    const source = join(volumesDir, input.teamId, mount.volumeId);
    // An image volume (one host's) is bound as its mounted filesystem, mounted again here after a reboot.
    await mountVolumeImage(source).catch((error: Error) => {
      throw new AgentError("failed_precondition", `volume ${mount.volumeId} cannot be mounted: ${error.message}`);
    });
    const found = await stat(source).catch(() => undefined);
    if (!found?.isDirectory()) {
      throw new AgentError(
        "failed_precondition",
        `volume ${mount.volumeId} is not on this node (${volumesDir} must be the filesystem the api writes)`,
      );
    }
    binds.push({ source, destination: mount.path });
  }
  return binds;
}
