import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);

/**
 * Unmounts every filesystem mounted below `dir`, deepest first (lazily: whatever still holds one open keeps its
 * view). With image volumes (WARREN_VOLUME_IMAGES) the api and node agents mount one filesystem per volume under
 * the cluster's volume folder, and they stay mounted after those processes end.
 */
export async function unmountUnder(dir: string): Promise<void> {
  const { stdout } = await run("findmnt", ["--list", "--noheadings", "--output", "TARGET"]).catch(() => ({
    stdout: "",
  }));
  const targets = stdout
    .split("\n")
    .map((line) => line.trim())
    .filter((target) => target.startsWith(`${dir}/`));
  for (const target of targets.sort().reverse()) await run("umount", ["--lazy", "--", target]).catch(() => undefined);
}
