import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import { APPROVAL_HEADER, APPROVAL_ID_HEADER } from "@warren/proto/exec-policy";
import type { SandboxRoute } from "@warren/proto/redis";
import {
  type ExecGate,
  ExecGateError,
  gatedRequest,
  MAX_GUARDED_UPLOAD_BYTES,
  MAX_RPC_BODY_BYTES,
  readBody,
} from "./exec-gate.js";
import type { Logger } from "./log.js";
import type { ProxyMetrics } from "./metrics.js";
import {
  connectStreamError,
  findGrant,
  readStartBody,
  SECRET_GRANT_HEADER,
  SecretGrantError,
  type SecretGrantRedeemer,
  secretEnvHeader,
} from "./secret-grants.js";

/** What the proxy changes in a request it read whole: headers added upstream and the body that replaces the client's. */
export interface Rewrite {
  readonly headers: readonly [string, string][];
  readonly body: Buffer;
}

/** envd requests read before they are forwarded: process starts (secrets, exec policy) and guarded file writes. */
export type InterceptedKind = "start" | "file-rpc" | "files";

export interface EnvdInterceptDeps {
  readonly envdPort: number;
  readonly log: Logger;
  readonly metrics: ProxyMetrics;
  /** Redeems secret grants carried by Start requests (the api's internal path). */
  readonly secretGrants?: SecretGrantRedeemer;
  /** Enforces teams' exec policies (exec-gate.ts); none: E2B's behaviour. */
  readonly execGate?: ExecGate;
}

function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name.toLowerCase()];
  return Array.isArray(value) ? value[0] : value;
}

/**
 * A streaming call answered with only its end-of-stream error keeps the client's codec in its content type: the
 * end-stream message is JSON in both codecs, and a proto client refuses a JSON content type.
 */
function streamContentType(req: IncomingMessage): string {
  const type = (req.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase();
  return type === "application/connect+proto" ? "application/connect+proto" : "application/connect+json";
}

/**
 * The envd requests the proxy reads before forwarding (every other request streams through untouched):
 * - `process.Start`: a secret grant in its header or envs is redeemed at the api and the values go to envd in one
 *   header for this process only (never logged here); under an exec policy the start is judged first, so a held
 *   or denied start does not use up its grant.
 * - under an exec policy that guards files: `MakeDir`/`Remove`/`Move` (small bodies, decoded) and `POST /files`
 *   (by its `path` query, streamed on untouched, or a multi-file form's part names, read whole).
 * A refusal is answered here in the shape the client's protocol expects.
 */
export class EnvdIntercept {
  constructor(private readonly deps: EnvdInterceptDeps) {}

  kindOf(req: IncomingMessage, port: number, route: SandboxRoute | undefined): InterceptedKind | undefined {
    if (port !== this.deps.envdPort) return undefined;
    const kind = gatedRequest(req.method, req.url);
    if (kind === "start") return kind;
    return kind && this.deps.execGate && route ? kind : undefined;
  }

  /**
   * Reads and judges the request: resolves with what to forward (undefined: the request as it came), or null when
   * it was answered here (refused).
   */
  async prepare(
    kind: InterceptedKind,
    req: IncomingMessage,
    res: ServerResponse,
    sandboxId: string,
    route: SandboxRoute | undefined,
    signal: AbortSignal,
  ): Promise<Rewrite | undefined | null> {
    try {
      return kind === "start"
        ? await this.start(req, sandboxId, route, signal)
        : await this.fileWrite(kind, req, route);
    } catch (error) {
      if (!res.destroyed) this.refuse(kind, req, res, sandboxId, error);
      return null;
    }
  }

  private async start(
    req: IncomingMessage,
    sandboxId: string,
    route: SandboxRoute | undefined,
    signal: AbortSignal,
  ): Promise<Rewrite> {
    const read = await readStartBody(req);
    const contentType = req.headers["content-type"] ?? "";
    const found = findGrant(header(req.headers, SECRET_GRANT_HEADER), contentType, read);
    const body =
      this.deps.execGate && route
        ? await this.deps.execGate.checkStart(route, gateHeaders(req), contentType, found.body)
        : found.body;
    if (found.grant === undefined) return { headers: [], body };
    if (!this.deps.secretGrants) {
      throw new SecretGrantError("failed_precondition", "this proxy redeems no secret grants (PROXY_RESUME_URL unset)");
    }
    const env = await this.deps.secretGrants.redeem(sandboxId, found.grant, signal);
    return { headers: [secretEnvHeader(env)], body };
  }

  private async fileWrite(
    kind: "file-rpc" | "files",
    req: IncomingMessage,
    route: SandboxRoute | undefined,
  ): Promise<Rewrite | undefined> {
    const gate = this.deps.execGate;
    if (!gate || !route) return undefined;
    const contentType = req.headers["content-type"] ?? "";
    const url = req.url ?? "/";
    // Without a policy that guards files neither reads the body: the request streams on untouched.
    const body =
      kind === "file-rpc"
        ? await gate.checkFileRpc(route, gateHeaders(req), url, contentType, () => readBody(req, MAX_RPC_BODY_BYTES))
        : await gate.checkUpload(route, gateHeaders(req), url, contentType, () =>
            readBody(req, MAX_GUARDED_UPLOAD_BYTES),
          );
    return body ? { headers: [], body } : undefined;
  }

  private refuse(kind: InterceptedKind, req: IncomingMessage, res: ServerResponse, sandboxId: string, error: unknown) {
    const { log, metrics } = this.deps;
    if (kind === "start" && !(error instanceof ExecGateError)) {
      const grantError =
        error instanceof SecretGrantError
          ? error
          : new SecretGrantError("invalid_argument", `start request could not be read: ${(error as Error).message}`);
      log.warn("secret grant refused", { sandboxId, code: grantError.code });
      metrics.requests.inc({ kind: "http", status: "200" });
      res.writeHead(200, { "Content-Type": streamContentType(req) });
      res.end(connectStreamError(grantError.code, grantError.message));
      return;
    }
    const gateError =
      error instanceof ExecGateError
        ? error
        : new ExecGateError("invalid_argument", `request could not be read: ${(error as Error).message}`);
    log.info("exec policy held a request back", {
      sandboxId,
      code: gateError.code,
      ...(gateError.approvalId ? { approvalId: gateError.approvalId } : {}),
    });
    const approval = gateError.approvalId ? { [APPROVAL_ID_HEADER]: gateError.approvalId } : {};
    if (kind === "start") {
      metrics.requests.inc({ kind: "http", status: "200" });
      res.writeHead(200, { "Content-Type": streamContentType(req), ...approval });
      res.end(
        connectStreamError(
          gateError.code,
          gateError.message,
          gateError.approvalId ? { [APPROVAL_ID_HEADER]: [gateError.approvalId] } : undefined,
        ),
      );
      return;
    }
    const status = gateError.httpStatus;
    metrics.requests.inc({ kind: "http", status: String(status) });
    // Unary Connect errors carry the code; envd's HTTP errors (`/files`) carry the status, as E2B's envd does.
    const body =
      kind === "file-rpc"
        ? { code: gateError.code, message: gateError.message }
        : { code: status, message: gateError.message };
    res.writeHead(status, { "Content-Type": "application/json", ...approval });
    res.end(JSON.stringify(body));
  }
}

function gateHeaders(req: IncomingMessage) {
  const authorization = header(req.headers, "authorization");
  const approval = header(req.headers, APPROVAL_HEADER);
  return { ...(authorization ? { authorization } : {}), ...(approval ? { approval } : {}) };
}
