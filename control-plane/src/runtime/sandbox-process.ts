import { readFile } from "node:fs/promises";
import { request } from "node:http";

/** envd's port in every sandbox (E2B's), and the code gateway's in code templates. */
import { CODE_GATEWAY_PORT, ENVD_PORT } from "@warren/proto/ports";

export { CODE_GATEWAY_PORT, ENVD_PORT };

/** GET /health on envd (or another port, e.g. the code gateway's) at a sandbox's address; true on any 2xx. */
export function healthy(addr: string, timeoutMs: number, port = ENVD_PORT): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request(
      { host: addr, port, path: "/health", method: "GET", agent: false, timeout: timeoutMs },
      (res) => {
        res.resume();
        resolve((res.statusCode ?? 500) < 300);
      },
    );
    req.once("timeout", () => req.destroy());
    req.once("error", () => resolve(false));
    req.end();
  });
}

/** Field 3 of /proc/<pid>/stat (R, S, D, Z…), undefined when there is no such process. */
export async function processState(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  } catch {
    return undefined;
  }
}

/** Field 22 of /proc/<pid>/stat: tells a live process from a recycled pid. */
export async function processStartTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}
