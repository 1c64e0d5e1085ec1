import { ARTIFACT_PATHS, ARTIFACT_SCHEMAS } from "./openapi-artifacts.js";
import { EXEC_POLICY_PATHS, EXEC_POLICY_SCHEMAS } from "./openapi-exec-policy.js";
import { SECRET_PATHS, SECRET_SCHEMAS } from "./openapi-secrets.js";
import { TEMPLATE_PATHS, TEMPLATE_SCHEMAS } from "./openapi-templates.js";
import { VOLUME_PATHS, VOLUME_SCHEMAS, VOLUME_SECURITY_SCHEMES } from "./openapi-volumes.js";

/**
 * The OpenAPI 3.1 document for everything the api serves: E2B's paths (as the `e2b` 2.51.0 SDK uses them) and
 * Warren's extras under /warren/v1. Served at /openapi.json (and /warren/v1/openapi.json).
 */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const id = { name: "sandboxID", in: "path", required: true, schema: { type: "string" } };
const stdErrors = { 401: error("Missing or invalid API key"), 404: error("Not found (or another team's)") };

const stringMap = { type: "object", additionalProperties: { type: "string" } };
/** Pause and snapshot: E2B's `memory`, or `mode` as SDKs from 2.55 name it (both given must agree). */
const memoryMode = {
  memory: { type: "boolean", default: true, description: "false: files only (a cold boot on resume)" },
  mode: { type: "string", enum: ["full", "filesystem"], description: "'filesystem' is memory: false" },
};

const schemas: Record<string, Schema> = {
  Error: {
    type: "object",
    required: ["code", "message"],
    properties: { code: { type: "integer" }, message: { type: "string" }, error_code: { type: "string" } },
  },
  SandboxNetworkConfig: {
    type: "object",
    properties: {
      allowOut: { type: "array", items: { type: "string" } },
      denyOut: { type: "array", items: { type: "string" } },
      allowPublicTraffic: { type: "boolean" },
      maskRequestHost: { type: "string" },
    },
  },
  NewSandboxV2: {
    type: "object",
    required: ["templateID"],
    properties: {
      templateID: { type: "string" },
      timeout: { type: "integer", format: "int32", default: 300 },
      metadata: stringMap,
      envVars: stringMap,
      allow_internet_access: { type: "boolean" },
      network: ref("SandboxNetworkConfig"),
      autoPause: { type: "boolean", default: false },
      autoPauseMemory: { type: "boolean", default: true },
      autoResume: { type: "object", properties: { enabled: { type: "boolean" } } },
      mcp: {
        type: ["object", "null"],
        description: "E2B Mcp: server name -> config. Only the names are kept; the SDK starts mcp-gateway itself",
        additionalProperties: { type: "object" },
      },
    },
  },
  NewSandbox: {
    allOf: [
      ref("NewSandboxV2"),
      { properties: { timeout: { type: "integer", default: 15 }, secure: { type: "boolean" } } },
    ],
  },
  Sandbox: {
    type: "object",
    required: ["sandboxID", "templateID", "clientID", "envdVersion"],
    properties: {
      sandboxID: { type: "string" },
      templateID: { type: "string" },
      alias: { type: "string" },
      clientID: { type: "string" },
      envdVersion: { type: "string" },
      envdAccessToken: { type: "string" },
      trafficAccessToken: { type: ["string", "null"] },
      domain: { type: ["string", "null"] },
    },
  },
  ListedSandbox: {
    type: "object",
    required: ["sandboxID", "templateID", "clientID", "startedAt", "endAt", "state", "cpuCount", "memoryMB"],
    properties: {
      sandboxID: { type: "string" },
      templateID: { type: "string" },
      alias: { type: "string" },
      clientID: { type: "string" },
      startedAt: { type: "string", format: "date-time" },
      endAt: { type: "string", format: "date-time" },
      state: { type: "string", enum: ["running", "paused"] },
      cpuCount: { type: "integer" },
      memoryMB: { type: "integer" },
      diskSizeMB: { type: "integer" },
      envdVersion: { type: "string" },
      metadata: stringMap,
      volumeMounts: { type: "array", items: { type: "object" } },
      nodeID: {
        type: ["string", "null"],
        description: "Warren extra: the node the sandbox is placed on (null until placed)",
      },
    },
  },
  SandboxDetail: {
    allOf: [
      ref("ListedSandbox"),
      {
        properties: {
          allowInternetAccess: { type: ["boolean", "null"] },
          network: ref("SandboxNetworkConfig"),
          egress: {
            type: "object",
            description: "Warren extra: the egress policy the node enforces (request folded with the team's mode)",
            properties: {
              allowOut: { type: "array", items: { type: "string" } },
              denyOut: { type: "array", items: { type: "string" } },
            },
          },
          lifecycle: {
            type: "object",
            properties: { onTimeout: { type: "string", enum: ["kill", "pause"] }, autoResume: { type: "boolean" } },
          },
          mcpServers: {
            type: "array",
            items: { type: "string" },
            description: "Warren extra: the MCP server names the create asked for",
          },
        },
      },
    ],
  },
  SandboxMetric: { type: "object" },
  SandboxLogEntry: {
    type: "object",
    properties: {
      timestamp: { type: "string", format: "date-time" },
      level: { type: "string", enum: ["debug", "info", "warn", "error"] },
      message: { type: "string" },
      fields: stringMap,
    },
  },
  SandboxEvent: {
    type: "object",
    properties: {
      id: { type: "string", description: "ledger cursor (increasing)" },
      sandboxID: { type: "string" },
      type: { type: "string" },
      fromState: { type: ["string", "null"] },
      toState: { type: ["string", "null"] },
      data: { type: "object" },
      timestamp: { type: "string", format: "date-time" },
    },
  },
  Team: {
    type: "object",
    properties: {
      id: { type: "string" },
      name: { type: "string" },
      maxConcurrentSandboxes: { type: "integer" },
      maxLengthHours: { type: "integer" },
      maxCreatesPerMinute: { type: "integer" },
      egressMode: {
        type: "string",
        enum: ["open", "closed", "forbidden"],
        description:
          "open: internet unless a sandbox asks otherwise (E2B default); closed: nothing leaves unless asked; forbidden: nothing leaves, asking is 403",
      },
    },
  },
  CreatedApiKey: {
    type: "object",
    properties: { id: { type: "string" }, key: { type: "string" }, prefix: { type: "string" } },
  },
  ApiKey: {
    type: "object",
    required: ["id", "name", "prefix", "createdAt", "revokedAt", "approver"],
    properties: {
      id: { type: "string" },
      name: { type: "string" },
      prefix: { type: "string", description: "the key's first 10 characters" },
      createdAt: { type: "string", format: "date-time" },
      revokedAt: { type: ["string", "null"], format: "date-time" },
      approver: { type: "boolean", description: "may change the team's exec policy and approve its reviews" },
    },
  },
};

const listParams = [
  { name: "metadata", in: "query", schema: { type: "string" }, description: "encoded key=value&... (AND)" },
  { name: "state", in: "query", schema: { type: "array", items: { type: "string", enum: ["running", "paused"] } } },
  { name: "startedAfter", in: "query", schema: { type: "string", format: "date-time" } },
  { name: "template", in: "query", schema: { type: "string" } },
  { name: "order", in: "query", schema: { type: "string", enum: ["asc", "desc"], default: "desc" } },
  { name: "limit", in: "query", schema: { type: "integer", minimum: 1, maximum: 100, default: 100 } },
  { name: "nextToken", in: "query", schema: { type: "string" } },
];

const createOp = (schema: string, summary: string) => ({
  summary,
  parameters: [{ name: "Idempotency-Key", in: "header", schema: { type: "string" } }],
  requestBody: { required: true, ...json(ref(schema)) },
  responses: {
    201: { description: "Created (envd answers)", ...json(ref("Sandbox")) },
    400: error("Invalid request"),
    401: error("Missing or invalid API key"),
    429: error("Team quota or create rate reached (Retry-After)"),
    503: error("No node could place the sandbox"),
  },
});

const connectOp = (summary: string) => ({
  summary,
  parameters: [id],
  requestBody: json({ type: "object", properties: { timeout: { type: "integer" }, memory: { type: "boolean" } } }),
  responses: {
    200: { description: "Running; endAt extended (never shortened)", ...json(ref("Sandbox")) },
    201: { description: "Resumed", ...json(ref("Sandbox")) },
    ...stdErrors,
  },
});

const noContent = { 204: { description: "Done" } };
const eventsParams = [
  { name: "cursor", in: "query", schema: { type: "string" } },
  { name: "limit", in: "query", schema: { type: "integer", minimum: 1, maximum: 1000 } },
];
const eventsPage = json({
  type: "object",
  properties: { events: { type: "array", items: ref("SandboxEvent") }, cursor: { type: "string" } },
});
const sse = {
  description: "text/event-stream; each event has `id:` (cursor) and `event:` (type); resume with Last-Event-ID",
  content: { "text/event-stream": { schema: { type: "string" } } },
};

export const OPENAPI_DOCUMENT = {
  openapi: "3.1.0",
  info: {
    title: "Warren API",
    version: "1.0.0",
    description:
      "E2B-compatible sandbox, template, volume and secret REST API (e2b SDK 2.51.0 and 2.45) plus Warren extras under /warren/v1.",
  },
  components: {
    securitySchemes: {
      ApiKeyAuth: { type: "apiKey", in: "header", name: "X-API-KEY" },
      AdminToken: { type: "apiKey", in: "header", name: "X-Admin-Token" },
      ...VOLUME_SECURITY_SCHEMES,
    },
    schemas: {
      ...schemas,
      ...TEMPLATE_SCHEMAS,
      ...VOLUME_SCHEMAS,
      ...SECRET_SCHEMAS,
      ...ARTIFACT_SCHEMAS,
      ...EXEC_POLICY_SCHEMAS,
    },
  },
  security: [{ ApiKeyAuth: [] }],
  paths: {
    ...TEMPLATE_PATHS,
    ...VOLUME_PATHS,
    ...SECRET_PATHS,
    ...ARTIFACT_PATHS,
    ...EXEC_POLICY_PATHS,
    "/v2/sandboxes": {
      post: createOp("NewSandboxV2", "Create a sandbox"),
      get: {
        summary: "List running and paused sandboxes",
        parameters: listParams,
        responses: {
          200: {
            description: "A page; X-Next-Token is present only when more pages remain",
            headers: {
              "X-Next-Token": { schema: { type: "string" } },
              "X-Total-Running": { schema: { type: "integer" } },
            },
            ...json({ type: "array", items: ref("ListedSandbox") }),
          },
          400: error("Invalid query"),
          401: error("Missing or invalid API key"),
        },
      },
    },
    "/sandboxes": {
      post: createOp("NewSandbox", "Create a sandbox (v1, default timeout 15 s)"),
      get: {
        summary: "List running sandboxes (v1)",
        parameters: [listParams[0]],
        responses: { 200: json({ type: "array", items: ref("ListedSandbox") }) },
      },
    },
    "/v2/sandboxes/{sandboxID}/connect": { post: connectOp("Connect (resume when paused)") },
    "/sandboxes/{sandboxID}/connect": { post: connectOp("Connect (v1; timeout required)") },
    "/sandboxes/{sandboxID}": {
      get: {
        summary: "Sandbox detail",
        parameters: [id],
        responses: { 200: json(ref("SandboxDetail")), ...stdErrors },
      },
      delete: { summary: "Kill", parameters: [id], responses: { ...noContent, ...stdErrors, 409: error("Busy") } },
    },
    "/sandboxes/{sandboxID}/timeout": {
      post: {
        summary: "Set endAt = now + timeout (may shorten; capped by the team's maximum length)",
        parameters: [id],
        requestBody: json({ type: "object", required: ["timeout"], properties: { timeout: { type: "integer" } } }),
        responses: { ...noContent, 400: error("Invalid"), ...stdErrors },
      },
    },
    "/sandboxes/{sandboxID}/network": {
      put: {
        summary:
          "Replace the egress policy of a running or paused sandbox (E2B SandboxNetworkUpdateConfig; omitted fields cleared)",
        parameters: [id],
        requestBody: json({
          type: "object",
          properties: {
            allowOut: { type: "array", items: { type: "string" }, description: "IPs, CIDRs, domains, *.domains" },
            denyOut: { type: "array", items: { type: "string" }, description: "IPs, CIDRs; 0.0.0.0/0 = all" },
            allow_internet_access: { type: "boolean" },
          },
        }),
        responses: { ...noContent, 400: error("Invalid policy"), 403: error("Team forbids egress"), ...stdErrors },
      },
    },
    "/sandboxes/{sandboxID}/refreshes": {
      post: {
        summary: "Keep alive: extend endAt by duration seconds (never shortens)",
        parameters: [id],
        requestBody: json({ type: "object", properties: { duration: { type: "integer" } } }),
        responses: { ...noContent, ...stdErrors },
      },
    },
    "/sandboxes/{sandboxID}/pause": {
      post: {
        summary: "Pause",
        parameters: [id],
        requestBody: json({ type: "object", properties: memoryMode }),
        responses: { ...noContent, ...stdErrors, 409: error("Already paused") },
      },
    },
    "/sandboxes/{sandboxID}/snapshots": {
      post: {
        summary: "Snapshot the sandbox (it runs on, or stays paused); usable as a templateID until deleted",
        parameters: [id],
        requestBody: json({
          type: "object",
          properties: { name: { type: "string", pattern: "^[a-z0-9][a-z0-9_-]{0,62}$" }, ...memoryMode },
        }),
        responses: {
          201: json({
            type: "object",
            description: "E2B SnapshotInfo plus Warren's memory (processes kept) and sizeBytes",
            properties: {
              snapshotID: { type: "string" },
              names: { type: "array", items: { type: "string" } },
              memory: { type: "boolean" },
              sizeBytes: { type: "integer" },
            },
          }),
          400: error("Invalid name"),
          ...stdErrors,
          503: error("The sandbox's node is unreachable or the capture failed (nothing recorded)"),
        },
      },
    },
    "/snapshots": {
      get: {
        summary: "The team's snapshots, newest first",
        parameters: [
          { name: "sandboxID", in: "query", schema: { type: "string" } },
          {
            name: "name",
            in: "query",
            schema: { type: "string" },
            description: "id or name, optionally namespace/ and :default",
          },
          { name: "limit", in: "query", schema: { type: "integer", minimum: 1, maximum: 100, default: 100 } },
          { name: "nextToken", in: "query", schema: { type: "string" } },
        ],
        responses: {
          200: {
            description: "A page; X-Next-Token when more remain",
            ...json({ type: "array", items: { type: "object" } }),
          },
        },
      },
    },
    "/sandboxes/{sandboxID}/fork": {
      post: {
        summary: "Fork: one capture of the sandbox, then count sandboxes from it (each admitted like a create)",
        parameters: [id],
        requestBody: json({
          type: "object",
          properties: { count: { type: "integer", minimum: 1, maximum: 20 }, timeout: { type: "integer" } },
        }),
        responses: {
          201: {
            description: "One entry per fork: {sandbox} or {error: {code, message}}; header X-Warren-Fork-Memory",
            ...json({ type: "array", items: { type: "object" } }),
          },
          400: error("Invalid count or timeout"),
          ...stdErrors,
        },
      },
    },
    "/sandboxes/{sandboxID}/resume": {
      post: {
        summary: "Resume (deprecated; use connect)",
        parameters: [id],
        responses: { 201: json(ref("Sandbox")), ...stdErrors, 409: error("Already running") },
      },
    },
    "/sandboxes/{sandboxID}/metrics": {
      get: {
        summary: "Sandbox metrics",
        parameters: [id],
        responses: { 200: json({ type: "array", items: ref("SandboxMetric") }), ...stdErrors },
      },
    },
    "/sandboxes/metrics": {
      get: {
        summary: "Latest metrics of several sandboxes",
        parameters: [{ name: "sandbox_ids", in: "query", schema: { type: "string" } }],
        responses: { 200: json({ type: "object", properties: { sandboxes: { type: "object" } } }) },
      },
    },
    "/sandboxes/{sandboxID}/logs": {
      get: {
        summary: "Sandbox lifecycle logs (v1)",
        parameters: [id],
        responses: {
          200: json({ type: "object", properties: { logs: { type: "array" }, logEntries: { type: "array" } } }),
          ...stdErrors,
        },
      },
    },
    "/v2/sandboxes/{sandboxID}/logs": {
      get: {
        summary: "Sandbox lifecycle logs",
        parameters: [id],
        responses: {
          200: json({ type: "object", properties: { logs: { type: "array", items: ref("SandboxLogEntry") } } }),
          ...stdErrors,
        },
      },
    },
    "/warren/v1/events": {
      get: {
        summary: "The team's sandbox_events ledger, after a cursor",
        parameters: eventsParams,
        responses: { 200: eventsPage },
      },
    },
    "/warren/v1/events/stream": { get: { summary: "Follow the team's ledger (SSE)", responses: { 200: sse } } },
    "/warren/v1/sandboxes/{sandboxID}/events": {
      get: {
        summary: "One sandbox's ledger",
        parameters: [id, ...eventsParams],
        responses: { 200: eventsPage, ...stdErrors },
      },
    },
    "/warren/v1/sandboxes/{sandboxID}/events/stream": {
      get: { summary: "Follow one sandbox's ledger (SSE)", parameters: [id], responses: { 200: sse, ...stdErrors } },
    },
    "/warren/v1/admin/teams/{teamID}": {
      patch: {
        summary: "Change a team's limits and egress mode (fields left out keep their value)",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "teamID", in: "path", required: true, schema: { type: "string" } }],
        requestBody: json(ref("Team")),
        responses: { 200: json(ref("Team")), 400: error("Invalid"), 404: error("Unknown team") },
      },
    },
    "/warren/v1/admin/teams": {
      post: {
        summary: "Create a team and its first API key (shown once)",
        security: [{ AdminToken: [] }],
        requestBody: json({ type: "object", required: ["name"], properties: { name: { type: "string" } } }),
        responses: {
          201: json({ type: "object", properties: { team: ref("Team"), apiKey: ref("CreatedApiKey") } }),
        },
      },
      get: {
        summary: "List teams",
        security: [{ AdminToken: [] }],
        responses: { 200: json({ type: "array", items: ref("Team") }) },
      },
    },
    "/warren/v1/admin/teams/{teamID}/api-keys": {
      post: {
        summary: "Create an API key (shown once)",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "teamID", in: "path", required: true, schema: { type: "string" } }],
        responses: { 201: json(ref("CreatedApiKey")) },
      },
      get: {
        summary: "List a team's API keys, revoked ones included, oldest first (never the key or its hash)",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "teamID", in: "path", required: true, schema: { type: "string" } }],
        responses: { 200: json({ type: "array", items: ref("ApiKey") }), 404: error("Unknown team") },
      },
    },
    "/warren/v1/admin/nodes": {
      get: {
        summary: "Nodes as last reconciled (id, addr, state up|down, lastSeenAt)",
        security: [{ AdminToken: [] }],
        responses: { 200: json({ type: "array", items: { type: "object" } }) },
      },
    },
    "/warren/v1/admin/nodes/{nodeID}/cordon": {
      post: {
        summary: "Cordon a node: no new sandboxes; its paused sandboxes resume on other nodes",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "nodeID", in: "path", required: true, schema: { type: "string" } }],
        responses: { ...noContent, 404: error("Unknown node") },
      },
      delete: {
        summary: "Uncordon a node",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "nodeID", in: "path", required: true, schema: { type: "string" } }],
        responses: { ...noContent, 404: error("Unknown node") },
      },
    },
    "/warren/v1/admin/api-keys/{keyID}": {
      delete: {
        summary: "Revoke an API key",
        security: [{ AdminToken: [] }],
        parameters: [{ name: "keyID", in: "path", required: true, schema: { type: "string" } }],
        responses: noContent,
      },
    },
    "/openapi.json": { get: { summary: "This document", security: [], responses: { 200: json({ type: "object" }) } } },
    "/health": { get: { summary: "Liveness", security: [], responses: { 200: json({ type: "object" }) } } },
    "/metrics": {
      get: { summary: "Prometheus metrics", security: [], responses: { 200: { description: "text/plain" } } },
    },
  },
} as const;
