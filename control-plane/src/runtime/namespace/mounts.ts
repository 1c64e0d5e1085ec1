import { readFile } from "node:fs/promises";
import { exec } from "../exec.js";

/** Mount points in the host mount namespace (the agent's), from /proc/self/mountinfo. */
export async function mountPoints(): Promise<string[]> {
  const text = await readFile("/proc/self/mountinfo", "utf8");
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) =>
      (line.split(" ")[4] ?? "").replace(/\\(\d{3})/g, (_, oct: string) =>
        String.fromCharCode(Number.parseInt(oct, 8)),
      ),
    );
}

/** Unmounts `path` (and anything below it), lazily when a plain unmount is refused; absent mounts are fine. */
export async function unmountTree(path: string): Promise<void> {
  // Deepest first.
  const below = (await mountPoints())
    .filter((p) => p === path || p.startsWith(`${path}/`))
    .sort((a, b) => b.length - a.length);
  if (below.length === 0) return;
  // One umount for all of them, in that order (a sandbox's teardown: its root and its disk); only what it left
  // mounted is retried alone, lazily when a plain unmount is refused.
  if ((await exec("umount", below, { allowFailure: true })).code === 0) return;
  const left = await mountPoints();
  for (const point of below) {
    if (!left.includes(point)) continue;
    const result = await exec("umount", [point], { allowFailure: true });
    if (result.code !== 0) await exec("umount", ["-l", point], { allowFailure: true });
  }
}
