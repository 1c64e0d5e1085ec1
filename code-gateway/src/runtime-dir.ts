import { mkdir, readdir, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import type { Logger } from "./log.js";

const DEFAULT_NAME = /^warren-cg-(\d+)$/;

/**
 * Creates the gateway's private runtime directory (kernel connection files and sockets).
 * A gateway that was SIGKILLed could not remove its own; when this one uses the default
 * `warren-cg-<pid>` naming, it removes those of gateways that are no longer running.
 */
export async function prepareRuntimeDir(runtimeDir: string, log: Logger): Promise<void> {
  if (DEFAULT_NAME.test(basename(runtimeDir))) {
    const parent = dirname(runtimeDir);
    for (const name of await readdir(parent).catch(() => [] as string[])) {
      const pid = Number(DEFAULT_NAME.exec(name)?.[1]);
      if (!pid || pid === process.pid || isRunning(pid)) continue;
      await rm(join(parent, name), { recursive: true, force: true });
      log.info("removed a dead gateway's runtime directory", { path: join(parent, name) });
    }
  }
  await mkdir(runtimeDir, { recursive: true, mode: 0o700 });
}

function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}
