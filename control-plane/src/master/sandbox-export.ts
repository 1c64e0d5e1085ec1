import { randomBytes } from "node:crypto";
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

/** Output a login shell's profile may print before the archive starts that is skipped; more is an error. */
const MAX_PREAMBLE_BYTES = 64 * 1024;

/**
 * The path arrives as an env var, never spliced into the command line. RunCommand runs `bash -l`, whose profile may
 * print to stdout, so the archive starts after a random marker. `head -c` bounds what leaves the sandbox: once the
 * limit is passed tar gets SIGPIPE and stops, instead of running on unseen. GNU tar's exit 1 ("a file changed as we
 * read it") still made a whole archive: the file is taken as it was read. The success path never runs the `exit`
 * builtin (in a login shell it would run ~/.bash_logout, whose output would land after the archive).
 */
const SCRIPT = `p="$WARREN_EXPORT_PATH"
if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo "no such file or directory: $p" >&2; exit ${EXIT_MISSING}; fi
cd -- "$(dirname -- "$p")" || exit 2
printf '%s' "$WARREN_EXPORT_MARKER"
if [ "$WARREN_EXPORT_LIMIT" = 0 ]; then tar --hard-dereference -cf - -- "$(basename -- "$p")"; s=$?
else tar --hard-dereference -cf - -- "$(basename -- "$p")" | head -c "$WARREN_EXPORT_LIMIT"; s=\${PIPESTATUS[0]}; fi
[ "$s" -le 1 ] || { echo "tar exited with $s" >&2; false; }`;

/** Drops whatever comes before `marker` in a byte stream, then passes everything through. */
export class ArchiveStart {
  private preamble = Buffer.alloc(0);
  private seen = false;

  constructor(private readonly marker: Buffer) {}

  /** Whether the marker came: the archive has begun. */
  get started(): boolean {
    return this.seen;
  }

  /** The bytes of `chunk` that belong to the archive (none while the marker has not been seen). */
  feed(chunk: Uint8Array): Uint8Array {
    if (this.seen) return chunk;
    this.preamble = Buffer.concat([this.preamble, chunk]);
    const at = this.preamble.indexOf(this.marker);
    if (at < 0) {
      if (this.preamble.length > MAX_PREAMBLE_BYTES + this.marker.length) {
        throw new MasterError("internal", `the sandbox printed over ${MAX_PREAMBLE_BYTES} bytes before the archive`);
      }
      return new Uint8Array(0);
    }
    this.seen = true;
    const rest = this.preamble.subarray(at + this.marker.length);
    this.preamble = Buffer.alloc(0);
    return rest;
  }
}

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
    const marker = randomBytes(24).toString("hex");
    const start = new ArchiveStart(Buffer.from(marker));
    const events = this.deps.nodeAgent(node.nodeId, node.addr).runCommand(
      sandboxId,
      envdToken,
      {
        command: SCRIPT,
        user: "root",
        cwd: "/",
        env: { WARREN_EXPORT_PATH: path, WARREN_EXPORT_LIMIT: String(limit), WARREN_EXPORT_MARKER: marker },
        timeoutMs: EXPORT_TIMEOUT_MS,
      },
      signal,
    );
    let size = 0;
    let stderr = "";
    try {
      for await (const event of events) {
        if (event.kind === "stdout") {
          const data = start.feed(event.data);
          if (data.byteLength === 0) continue;
          size += data.byteLength;
          if (maxBytes > 0 && size > maxBytes) {
            throw new MasterError("quota", `'${path}' archives to more than the ${maxBytes} bytes allowed`);
          }
          yield { kind: "chunk", data };
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
          if (!start.started) throw new MasterError("internal", `archiving '${path}' printed no archive`);
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
