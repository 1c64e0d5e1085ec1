import { posix } from "node:path";
import type { Db } from "../store/db.js";
import { getSandbox } from "../store/sandboxes.js";
import { MasterError, notFound } from "./errors.js";
import type { SandboxLifecycle } from "./lifecycle.js";
import { type NodeAgentConnector, NodeAgentError } from "./node-agent-client.js";
import type { NodeRegistry } from "./node-registry.js";

export interface SandboxExportDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  /** Gives the sandbox's envd access token (derived, never stored). */
  readonly lifecycle: SandboxLifecycle;
}

/** One message of the export stream: archive bytes in order, then the total. */
export type ExportEvent =
  | { readonly kind: "chunk"; readonly data: Uint8Array }
  | { readonly kind: "done"; readonly size: number };

/** The exit code the export script uses for "no such path" (tar's own codes are 0-2). */
const EXIT_MISSING = 44;
/** Longer than any sane artifact takes to archive; the api's size limit ends a runaway one sooner. */
const EXPORT_TIMEOUT_MS = 10 * 60_000;
/** Stderr kept for an error message. */
const STDERR_KEEP = 2048;

/**
 * The path arrives as an env var, never spliced into the command line. `head -c` bounds what leaves the sandbox:
 * once the limit is passed tar gets SIGPIPE and stops, instead of running on unseen. GNU tar's exit 1 ("a file
 * changed as we read it") still produced a whole archive; the file is taken as it was read.
 */
const SCRIPT = `p="$WARREN_EXPORT_PATH"
if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo "no such file or directory: $p" >&2; exit ${EXIT_MISSING}; fi
cd -- "$(dirname -- "$p")" || exit 2
if [ "$WARREN_EXPORT_LIMIT" = 0 ]; then tar --hard-dereference -cf - -- "$(basename -- "$p")"; s=$?
else tar --hard-dereference -cf - -- "$(basename -- "$p")" | head -c "$WARREN_EXPORT_LIMIT"; s=\${PIPESTATUS[0]}; fi
[ "$s" -le 1 ] && exit 0; exit "$s"`;

/** An absolute, normalized path in the sandbox, not the root itself; anything else is `invalid`. */
export function exportPath(raw: string): string {
  if (!raw.startsWith("/")) throw new MasterError("invalid", `path '${raw.slice(0, 200)}' must be absolute`);
  if (raw.includes("\0")) throw new MasterError("invalid", "path must not contain a NUL byte");
  const path = posix.normalize(raw).replace(/\/+$/, "");
  if (path === "") throw new MasterError("invalid", "path '/' is the whole sandbox; name a file or folder in it");
  return path;
}

/**
 * Streams a tar of one file or folder of a running sandbox out of it (artifacts), through the node agent's
 * RunCommand as root: the sandbox's own view of its filesystem, so its symlinks stay links and nothing is read on
 * the host through the rootfs. Read-only for the sandbox; no row lock (publishing is not a lifecycle transition).
 */
export class SandboxExport {
  constructor(private readonly deps: SandboxExportDeps) {}

  async *export(
    teamId: string,
    sandboxId: string,
    rawPath: string,
    maxBytes: number,
    signal: AbortSignal,
  ): AsyncGenerator<ExportEvent> {
    const path = exportPath(rawPath);
    const row = await getSandbox(this.deps.db, sandboxId);
    if (!row || row.teamId !== teamId || row.state === "killed" || row.state === "failed") throw notFound(sandboxId);
    if (row.state !== "running") {
      throw new MasterError(
        "conflict",
        `sandbox ${sandboxId} is ${row.state}; artifacts are published from a running sandbox`,
      );
    }
    const node = (await this.deps.registry.liveNodes()).find((n) => n.nodeId === row.nodeId);
    if (!node) throw new MasterError("unavailable", `the node of sandbox ${sandboxId} is not reachable; retry later`);
    const envdToken = this.deps.lifecycle.view(row).envdAccessToken;
    // One byte past the limit tells "exactly at the limit" from "over it".
    const limit = maxBytes > 0 ? maxBytes + 1 : 0;
    const events = this.deps.nodeAgent(node.nodeId, node.addr).runCommand(
      sandboxId,
      envdToken,
      {
        command: SCRIPT,
        user: "root",
        cwd: "/",
        env: { WARREN_EXPORT_PATH: path, WARREN_EXPORT_LIMIT: String(limit) },
        timeoutMs: EXPORT_TIMEOUT_MS,
      },
      signal,
    );
    let size = 0;
    let stderr = "";
    try {
      for await (const event of events) {
        if (event.kind === "stdout") {
          size += event.data.byteLength;
          if (maxBytes > 0 && size > maxBytes) {
            throw new MasterError("quota", `'${path}' archives to more than the ${maxBytes} bytes allowed`);
          }
          yield { kind: "chunk", data: event.data };
        } else if (event.kind === "stderr") {
          if (stderr.length < STDERR_KEEP) stderr += Buffer.from(event.data).toString("utf8");
        } else if (event.kind === "exit") {
          if (event.exitCode === EXIT_MISSING) {
            throw new MasterError("not_found", `path '${path}' does not exist in sandbox ${sandboxId}`);
          }
          if (event.exitCode !== 0) {
            throw new MasterError(
              "internal",
              `archiving '${path}' failed (exit ${event.exitCode}): ${stderr.trim().slice(0, 500)}`,
            );
          }
          yield { kind: "done", size };
          return;
        }
      }
    } catch (error) {
      if (error instanceof NodeAgentError) {
        if (error.kind === "not_found") throw notFound(sandboxId);
        throw new MasterError("unavailable", `archiving '${path}' in sandbox ${sandboxId} failed: ${error.message}`);
      }
      throw error;
    }
    throw new MasterError("internal", `the node ended the archive of '${path}' without its exit`);
  }
}
