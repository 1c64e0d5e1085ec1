import { createHash } from "node:crypto";
import { Readable } from "node:stream";
import { type DescMessage, fromBinary, fromJson, type MessageShape, toBinary, toJson } from "@bufbuild/protobuf";
import { ENVD_FILES_PATH, ENVD_FILES_QUERY } from "@warren/proto/envd-http";
import {
  APPROVAL_ENV,
  APPROVAL_HEADER,
  commandLines,
  EXEC_POLICIES_SYNCED_KEY,
  type ExecPolicy,
  type ExecRequest,
  evaluateExecPolicy,
  execPolicyKey,
  type FileOp,
  normalizePath,
  policyGuardsFiles,
} from "@warren/proto/exec-policy";
import { MakeDirRequestSchema, MoveRequestSchema, RemoveRequestSchema } from "@warren/proto/filesystem/filesystem_pb";
import { StartRequestSchema } from "@warren/proto/process/process_pb";
import type { SandboxRoute } from "@warren/proto/redis";
import busboy from "busboy";
import type { Redis } from "ioredis";
import { START_PATH } from "./secret-grants.js";

/**
 * What the gate answers instead of forwarding: a Connect code (and the HTTP status of `/files`). When the gate
 * cannot decide (the policies or the api are out of reach) it answers `aborted`, "try again": E2B's SDK words
 * `unavailable` as "the sandbox is probably not running anymore", which would send its users the wrong way.
 */
export class ExecGateError extends Error {
  constructor(
    readonly code: "permission_denied" | "failed_precondition" | "aborted" | "invalid_argument",
    message: string,
    /** The review a `review` rule opened: the client retries with it once approved. */
    readonly approvalId?: string,
  ) {
    super(message);
    this.name = "ExecGateError";
  }

  get httpStatus(): number {
    return this.code === "aborted" ? 503 : this.code === "invalid_argument" ? 400 : 403;
  }
}

/** The api's side of a `deny` or `review` (store/exec-approvals.ts behind its internal paths). */
export interface ExecDecider {
  recordDenial(decision: GateDecision): Promise<void>;
  openReview(decision: GateDecision & { digest: string; ttlSeconds: number }): Promise<{ approvalId: string }>;
  /** Resolves when the approval is used now for this request; rejects with ExecGateError saying why not. */
  redeem(sandboxId: string, approvalId: string, digest: string): Promise<void>;
}

export interface GateDecision {
  readonly sandboxId: string;
  readonly teamId: string;
  readonly kind: "start" | FileOp;
  readonly rule: string;
  readonly request: Record<string, unknown>;
}

const INTERNAL_TOKEN_HEADER = "X-Warren-Internal-Token";

/** `POST <api>/warren/v1/internal/exec-decisions` and `…/exec-approvals/redeem` with the internal token. */
export class ControlPlaneExecDecider implements ExecDecider {
  private readonly base: string;

  constructor(
    url: string,
    private readonly token: string,
  ) {
    this.base = url.replace(/\/+$/, "");
  }

  private async post(path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
    let response: Response;
    try {
      response = await fetch(`${this.base}${path}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", [INTERNAL_TOKEN_HEADER]: this.token },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(10_000),
      });
    } catch (error) {
      throw new ExecGateError("aborted", `exec policy decision could not reach the api: ${(error as Error).message}`);
    }
    const text = await response.text();
    let json: Record<string, unknown> = {};
    try {
      json = JSON.parse(text) as Record<string, unknown>;
    } catch {
      // A non-JSON answer is reported by status below.
    }
    return { status: response.status, json };
  }

  async recordDenial(decision: GateDecision): Promise<void> {
    const { status } = await this.post("/warren/v1/internal/exec-decisions", { ...decision, action: "deny" });
    if (status !== 200) throw new ExecGateError("aborted", `recording an exec denial answered ${status}`);
  }

  async openReview(decision: GateDecision & { digest: string; ttlSeconds: number }): Promise<{ approvalId: string }> {
    const { status, json } = await this.post("/warren/v1/internal/exec-decisions", {
      ...decision,
      action: "review",
    });
    if (status !== 200 || typeof json.approvalId !== "string") {
      throw new ExecGateError("aborted", `opening an exec review answered ${status}`);
    }
    return { approvalId: json.approvalId };
  }

  async redeem(sandboxId: string, approvalId: string, digest: string): Promise<void> {
    const { status, json } = await this.post("/warren/v1/internal/exec-approvals/redeem", {
      sandboxId,
      approvalId,
      digest,
    });
    if (status === 200) return;
    if (status === 403) {
      throw new ExecGateError(
        "permission_denied",
        typeof json.message === "string" ? json.message : `approval ${approvalId} cannot be used`,
      );
    }
    throw new ExecGateError("aborted", `redeeming an approval answered ${status}`);
  }
}

/** envd's paths the gate reads: process starts and the file operations a path rule can cover. */
const FILE_RPCS = new Set([
  "/filesystem.Filesystem/Remove",
  "/filesystem.Filesystem/Move",
  "/filesystem.Filesystem/MakeDir",
]);
// Unary file RPC bodies are tiny; a multi-file upload is read whole only when a policy guards files.
export const MAX_RPC_BODY_BYTES = 64 * 1024;
export const MAX_GUARDED_UPLOAD_BYTES = 16 * 1024 * 1024;

/** Which of envd's requests a gate may have to hold back. */
export function gatedRequest(
  method: string | undefined,
  url: string | undefined,
): "start" | "file-rpc" | "files" | undefined {
  if (method !== "POST") return undefined;
  const path = (url ?? "").split("?")[0] ?? "";
  if (path === START_PATH) return "start";
  if (FILE_RPCS.has(path)) return "file-rpc";
  if (path === ENVD_FILES_PATH) return "files";
  return undefined;
}

/** The user of `Authorization: Basic base64("<name>:")`, as envd reads it. */
export function basicUser(authorization: string | undefined): string | undefined {
  const match = /^Basic\s+(\S+)$/i.exec((authorization ?? "").trim());
  if (!match?.[1]) return undefined;
  const decoded = Buffer.from(match[1], "base64").toString("utf8");
  const name = decoded.split(":")[0];
  return name || undefined;
}

function homeOf(user: string): string {
  return user === "root" ? "/root" : `/home/${user}`;
}

/** A client path as envd resolves it (`~`, relative to the user's home), normalised. */
export function resolvePath(path: string, user: string): string {
  if (path === "~") return homeOf(user);
  if (path.startsWith("~/")) return normalizePath(`${homeOf(user)}/${path.slice(2)}`);
  if (path.startsWith("/")) return normalizePath(path);
  return normalizePath(`${homeOf(user)}/${path}`);
}

function digestOf(value: unknown): string {
  return createHash("sha256").update(JSON.stringify(value)).digest("hex");
}

type Codec = "json" | "proto";

function codecOf(contentType: string, streaming: boolean): Codec {
  const type = contentType.split(";")[0]?.trim().toLowerCase() ?? "";
  if (type === (streaming ? "application/connect+json" : "application/json")) return "json";
  if (type === (streaming ? "application/connect+proto" : "application/proto")) return "proto";
  throw new ExecGateError("invalid_argument", `content type '${type}' is not a Connect codec`);
}

function decode<Desc extends DescMessage>(schema: Desc, codec: Codec, bytes: Uint8Array): MessageShape<Desc> {
  try {
    return codec === "json"
      ? fromJson(schema, JSON.parse(Buffer.from(bytes).toString("utf8")), { ignoreUnknownFields: true })
      : fromBinary(schema, bytes);
  } catch (error) {
    throw new ExecGateError("invalid_argument", `request could not be decoded: ${(error as Error).message}`);
  }
}

function encode<Desc extends DescMessage>(schema: Desc, codec: Codec, message: MessageShape<Desc>): Buffer {
  return codec === "json"
    ? Buffer.from(JSON.stringify(toJson(schema, message)), "utf8")
    : Buffer.from(toBinary(schema, message));
}

/** Reads a team's policy from the master's Redis mirror. */
export interface PolicySource {
  /** undefined: the team has none; throws ExecGateError("aborted") while the mirror is not synced. */
  policyOf(teamId: string): Promise<ExecPolicy | undefined>;
}

export class RedisPolicySource implements PolicySource {
  constructor(private readonly redis: Redis) {}

  async policyOf(teamId: string): Promise<ExecPolicy | undefined> {
    let values: (string | null)[];
    try {
      values = await this.redis.mget(execPolicyKey(teamId), EXEC_POLICIES_SYNCED_KEY);
    } catch (error) {
      throw new ExecGateError("aborted", `exec policies cannot be read: ${(error as Error).message}`);
    }
    const [policy, synced] = values;
    // Fail closed: a Redis that lost its data (no stamp) may also have lost this team's policy.
    if (!synced) throw new ExecGateError("aborted", "exec policies are not loaded yet; retry in a few seconds");
    if (!policy) return undefined;
    try {
      return JSON.parse(policy) as ExecPolicy;
    } catch {
      throw new ExecGateError("aborted", "the team's exec policy in Redis is unreadable");
    }
  }
}

const ORDER = { allow: 0, review: 1, deny: 2 } as const;

/**
 * Enforces teams' exec policies on envd's process starts and file writes and removes, whichever SDK sends them
 * (issue 24 part 4). `allow` forwards; `deny` answers permission_denied naming the rule (and records
 * `exec.denied`); `review` opens an approval and answers failed_precondition with its id, and forwards the same
 * request once, when it comes back carrying that id approved.
 */
export class ExecGate {
  constructor(
    private readonly policies: PolicySource,
    private readonly decider: ExecDecider,
  ) {}

  /** Returns the body to forward (the approval env entry taken out) or throws ExecGateError. */
  async checkStart(route: SandboxRoute, headers: Headers, contentType: string, body: Buffer): Promise<Buffer> {
    const policy = await this.policies.policyOf(route.team);
    if (!policy) return body;
    if (body.length < 5) throw new ExecGateError("invalid_argument", "start request body is not a Connect envelope");
    const flags = body[0] as number;
    const length = body.readUInt32BE(1);
    if (flags !== 0 || length !== body.length - 5) {
      throw new ExecGateError(
        "invalid_argument",
        "under an exec policy a start request must be one uncompressed message",
      );
    }
    const codec = codecOf(contentType, true);
    const start = decode(StartRequestSchema, codec, body.subarray(5));
    const process = start.process;
    if (!process) throw new ExecGateError("invalid_argument", "start request has no process");
    const fromEnv = process.envs[APPROVAL_ENV];
    const presented = headers.approval ?? fromEnv;
    delete process.envs[APPROVAL_ENV];
    const user = basicUser(headers.authorization) ?? route.defaultUser ?? "user";
    const decision = evaluateExecPolicy(policy, { kind: "start", cmd: process.cmd, args: process.args, user });
    // envd gets the client's own bytes unless the approval rode in the envs (then it is taken out).
    let forwarded = body;
    if (fromEnv !== undefined) {
      const encoded = encode(StartRequestSchema, codec, start);
      const head = Buffer.alloc(5);
      head.writeUInt32BE(encoded.length, 1);
      forwarded = Buffer.concat([head, encoded]);
    }
    if (decision.action === "allow") return forwarded;

    const envNames = Object.keys(process.envs).sort();
    const request = {
      commandLine: commandLines(process.cmd, process.args)[0],
      cmd: process.cmd,
      args: process.args,
      user,
      cwd: process.cwd ?? homeOf(user),
      ...(envNames.length > 0 ? { envNames } : {}),
      ...(start.pty ? { pty: true } : {}),
      ...(start.tag !== undefined ? { tag: start.tag } : {}),
    };
    // Exactly as requested: every field envd acts on, env values included (hashed, never stored).
    const digest = digestOf({
      kind: "start",
      cmd: process.cmd,
      args: process.args,
      envs: Object.entries(process.envs).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
      cwd: process.cwd ?? null,
      user,
      pty: start.pty ? { cols: start.pty.size?.cols ?? 0, rows: start.pty.size?.rows ?? 0 } : null,
      tag: start.tag ?? null,
      stdin: start.stdin ?? null,
    });
    await this.settle(route, "start", decision.action, decision.ruleName, request, digest, presented, policy);
    return forwarded;
  }

  /**
   * Throws ExecGateError unless the policy lets every path of this file RPC through. The body is read only when a
   * policy guards files (returned, to go on as it came); undefined: not read, forward the request as it is.
   */
  async checkFileRpc(
    route: SandboxRoute,
    headers: Headers,
    url: string,
    contentType: string,
    readBody: () => Promise<Buffer>,
  ): Promise<Buffer | undefined> {
    const policy = await this.policies.policyOf(route.team);
    if (!policy || !policyGuardsFiles(policy)) return undefined;
    const body = await readBody();
    const codec = codecOf(contentType, false);
    const user = basicUser(headers.authorization) ?? route.defaultUser ?? "user";
    const method = url.split("?")[0];
    const ops: { op: FileOp; path: string }[] = [];
    if (method === "/filesystem.Filesystem/Move") {
      const move = decode(MoveRequestSchema, codec, body);
      ops.push({ op: "remove", path: move.source }, { op: "write", path: move.destination });
    } else if (method === "/filesystem.Filesystem/Remove") {
      ops.push({ op: "remove", path: decode(RemoveRequestSchema, codec, body).path });
    } else {
      ops.push({ op: "write", path: decode(MakeDirRequestSchema, codec, body).path });
    }
    await this.checkPaths(route, policy, headers, user, ops);
    return body;
  }

  /**
   * `POST /files`: the `path` query names the file; without it (a multi-file form) the parts' filenames do, and
   * the body is read whole (at most MAX_GUARDED_UPLOAD_BYTES) — returned so it can be forwarded.
   */
  async checkUpload(
    route: SandboxRoute,
    headers: Headers,
    url: string,
    contentType: string,
    readBody: () => Promise<Buffer>,
  ): Promise<Buffer | undefined> {
    const policy = await this.policies.policyOf(route.team);
    if (!policy || !policyGuardsFiles(policy)) return undefined;
    const query = new URL(url, "http://envd").searchParams;
    const user =
      query.get(ENVD_FILES_QUERY.username) || basicUser(headers.authorization) || route.defaultUser || "user";
    const path = query.get(ENVD_FILES_QUERY.path);
    if (path) {
      await this.checkPaths(route, policy, headers, user, [{ op: "write", path }]);
      return undefined;
    }
    const body = await readBody();
    const names = await multipartFilenames(contentType, body);
    if (names.length === 0) throw new ExecGateError("invalid_argument", "upload names no file (no path, no filenames)");
    await this.checkPaths(
      route,
      policy,
      headers,
      user,
      names.map((name) => ({ op: "write" as const, path: name })),
    );
    return body;
  }

  private async checkPaths(
    route: SandboxRoute,
    policy: ExecPolicy,
    headers: Headers,
    user: string,
    ops: { op: FileOp; path: string }[],
  ): Promise<void> {
    let worst: { action: "allow" | "deny" | "review"; ruleName: string; kind: FileOp } = {
      action: "allow",
      ruleName: "default",
      kind: "write",
    };
    const resolved = ops.map(({ op, path }) => ({ op, path: resolvePath(path, user) }));
    for (const { op, path } of resolved) {
      const request: ExecRequest = { kind: op, path };
      const decision = evaluateExecPolicy(policy, request);
      if (ORDER[decision.action] > ORDER[worst.action]) {
        worst = { action: decision.action, ruleName: decision.ruleName, kind: op };
      }
    }
    if (worst.action === "allow") return;
    const request = { path: resolved.map((r) => r.path).join(", "), user };
    const digest = digestOf({ kind: "files", ops: resolved, user });
    await this.settle(route, worst.kind, worst.action, worst.ruleName, request, digest, headers.approval, policy);
  }

  /** A deny or review: recorded at the api; a review passes only with its approval, used now. */
  private async settle(
    route: SandboxRoute,
    kind: "start" | FileOp,
    action: "deny" | "review",
    ruleName: string,
    request: Record<string, unknown>,
    digest: string,
    presented: string | undefined,
    policy: ExecPolicy,
  ): Promise<void> {
    const what = kind === "start" ? "command" : `file ${kind}`;
    const decision = { sandboxId: route.sandboxId, teamId: route.team, kind, rule: ruleName, request };
    if (action === "deny") {
      await this.decider.recordDenial(decision);
      throw new ExecGateError("permission_denied", `${what} denied by exec policy rule "${ruleName}"`);
    }
    if (presented) {
      await this.decider.redeem(route.sandboxId, presented, digest);
      return;
    }
    const { approvalId } = await this.decider.openReview({
      ...decision,
      digest,
      ttlSeconds: policy.reviewTtlSeconds ?? 3600,
    });
    throw new ExecGateError(
      "failed_precondition",
      `${what} needs approval (exec policy rule "${ruleName}"): approval ${approvalId}; once it is approved, send ` +
        `the same request again with ${kind === "start" ? `env ${APPROVAL_ENV} or ` : ""}header ${APPROVAL_HEADER}: ${approvalId}`,
      approvalId,
    );
  }
}

/** The request headers the gate reads. */
export interface Headers {
  readonly authorization?: string;
  readonly approval?: string;
}

/** The filenames of a multipart form's parts, in order (directories kept, as envd takes them). */
function multipartFilenames(contentType: string, body: Buffer): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const names: string[] = [];
    let parser: busboy.Busboy;
    try {
      parser = busboy({ headers: { "content-type": contentType }, preservePath: true });
    } catch (error) {
      reject(new ExecGateError("invalid_argument", `upload is not a multipart form: ${(error as Error).message}`));
      return;
    }
    parser.on("file", (_field, stream, info) => {
      if (info.filename) names.push(info.filename);
      stream.resume();
    });
    parser.on("close", () => resolve(names));
    parser.on("error", (error: Error) =>
      reject(new ExecGateError("invalid_argument", `upload could not be read: ${error.message}`)),
    );
    Readable.from([body]).pipe(parser);
  });
}

/** A request body read whole, refused past `maxBytes` (the gate reads only bodies it must judge). */
export async function readBody(req: AsyncIterable<Buffer>, maxBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of req) {
    total += chunk.length;
    if (total > maxBytes) {
      throw new ExecGateError(
        "invalid_argument",
        `request body is over ${maxBytes} bytes, the most an exec policy guarding files reads; ` +
          "upload files one at a time with the path query instead",
      );
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}
