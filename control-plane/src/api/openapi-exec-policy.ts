/** The exec policy and approval paths of the OpenAPI document (api/exec-policy.ts); merged in openapi.ts. */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const approvalId = { name: "approvalID", in: "path", required: true, schema: { type: "string" } };
const action = { enum: ["allow", "deny", "review"] };
const notApprover = { 403: error("The API key is not an approver key") };

export const EXEC_POLICY_SCHEMAS: Record<string, Schema> = {
  ExecRule: {
    type: "object",
    required: ["action"],
    description: "A command rule (command and/or asRoot) or a file rule (paths, ops); the first that matches decides",
    properties: {
      name: { type: "string" },
      action,
      command: { type: "string", description: "wildcard (*, ?) on the command line; for `bash -c S`, the script S" },
      asRoot: { type: "boolean", enum: [true] },
      paths: { type: "array", items: { type: "string" }, description: "absolute; each path and everything under it" },
      ops: { type: "array", items: { enum: ["write", "remove"] } },
    },
  },
  ExecPolicy: {
    type: "object",
    required: ["rules"],
    properties: {
      rules: { type: "array", items: ref("ExecRule"), maxItems: 200 },
      default: action,
      reviewTtlSeconds: { type: "integer", minimum: 1, maximum: 604800, default: 3600 },
    },
  },
  ExecApproval: {
    type: "object",
    properties: {
      approvalID: { type: "string" },
      sandboxID: { type: "string" },
      kind: { enum: ["start", "write", "remove"] },
      request: {
        type: "object",
        properties: {
          commandLine: { type: "string" },
          cmd: { type: "string" },
          args: { type: "array", items: { type: "string" } },
          cwd: { type: "string" },
          user: { type: "string" },
          envNames: { type: "array", items: { type: "string" }, description: "names only, never values" },
          path: { type: "string" },
        },
      },
      rule: { type: "string" },
      state: { enum: ["pending", "approved", "rejected", "used", "expired"] },
      requestedAt: { type: "string", format: "date-time" },
      expiresAt: { type: "string", format: "date-time" },
      decidedBy: { type: "string", nullable: true, description: "the approver key's id" },
      decidedAt: { type: "string", format: "date-time", nullable: true },
      reason: { type: "string", nullable: true },
      usedAt: { type: "string", format: "date-time", nullable: true },
    },
  },
};

const decide = (verdict: string) => ({
  post: {
    summary: `${verdict} a pending request (an approver key)`,
    parameters: [approvalId],
    requestBody: json({ type: "object", properties: { reason: { type: "string", maxLength: 1024 } } }),
    responses: {
      200: json(ref("ExecApproval")),
      ...notApprover,
      404: error("Unknown approval (or another team's)"),
      409: error("Not pending: decided, used or expired"),
    },
  },
});

export const EXEC_POLICY_PATHS = {
  "/warren/v1/me": {
    get: {
      summary: "The API key of the request: its team, its id and whether it is an approver",
      responses: {
        200: json({
          type: "object",
          properties: {
            teamID: { type: "string" },
            teamName: { type: "string" },
            keyID: { type: "string" },
            approver: { type: "boolean" },
          },
        }),
      },
    },
  },
  "/warren/v1/exec-policy": {
    get: {
      summary: "The team's exec policy (null: none, every request allowed)",
      responses: { 200: json({ type: "object", properties: { policy: { ...ref("ExecPolicy"), nullable: true } } }) },
    },
    put: {
      summary: "Replace the exec policy (an approver key); the proxies enforce it on envd starts and file writes",
      requestBody: json(ref("ExecPolicy")),
      responses: {
        200: json({ type: "object", properties: { policy: ref("ExecPolicy") } }),
        400: error("A field of the policy is wrong (the message names it)"),
        ...notApprover,
      },
    },
    delete: {
      summary: "Clear the exec policy (an approver key)",
      responses: { 204: { description: "Cleared" }, ...notApprover },
    },
  },
  "/warren/v1/exec-approvals": {
    get: {
      summary: "Requests held for review, newest first",
      parameters: [
        { name: "state", in: "query", schema: { enum: ["pending", "approved", "rejected", "used", "expired"] } },
        { name: "sandboxID", in: "query", schema: { type: "string" } },
        { name: "limit", in: "query", schema: { type: "integer", minimum: 1, maximum: 1000, default: 100 } },
      ],
      responses: { 200: json({ type: "array", items: ref("ExecApproval") }), 400: error("A bad filter") },
    },
  },
  "/warren/v1/exec-approvals/{approvalID}": {
    get: {
      summary: "One approval",
      parameters: [approvalId],
      responses: { 200: json(ref("ExecApproval")), 404: error("Unknown approval (or another team's)") },
    },
  },
  "/warren/v1/exec-approvals/{approvalID}/approve": decide("Approve"),
  "/warren/v1/exec-approvals/{approvalID}/reject": decide("Reject"),
};
