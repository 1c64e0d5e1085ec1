/**
 * The template build paths of the OpenAPI document (E2B's, as `e2b` 2.51.0 and E2B's CLI call them; see
 * shared/E2B-TEMPLATES.md §2) and their schemas; merged into the document in openapi.ts.
 */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const path = (name: string) => ({ name, in: "path", required: true, schema: { type: "string" } });
const strings = { type: "array", items: { type: "string" } };
const auth = { 401: error("Missing or invalid API key") };

export const TEMPLATE_SCHEMAS: Record<string, Schema> = {
  TemplateBuildRequestV3: {
    type: "object",
    required: ["name"],
    properties: {
      name: { type: "string", description: "name, name:tag or namespace/name:tag (namespace = your team's)" },
      tags: strings,
      cpuCount: { type: "integer", description: "1 or even, up to 32; default 2" },
      memoryMB: { type: "integer", description: "even, 128 to 65536; default 1024" },
      minFreeDiskMb: { type: "integer" },
    },
  },
  TemplateRequestResponseV3: {
    type: "object",
    required: ["templateID", "buildID", "names", "aliases", "tags", "public"],
    properties: {
      templateID: { type: "string" },
      buildID: { type: "string", format: "uuid" },
      names: strings,
      aliases: strings,
      tags: strings,
      public: { type: "boolean" },
    },
  },
  TemplateStep: {
    type: "object",
    required: ["type"],
    properties: {
      type: { type: "string", enum: ["RUN", "COPY", "ENV", "WORKDIR", "USER", "ADD", "ARG"] },
      args: strings,
      force: { type: "boolean" },
      filesHash: { type: "string", pattern: "^[0-9a-f]{64}$" },
    },
  },
  TemplateBuildStartV2: {
    type: "object",
    required: ["steps"],
    properties: {
      fromTemplate: { type: "string" },
      fromImage: { type: "string", description: "E2B's base image (e2bdev/base) maps to Warren's base" },
      fromImageRegistry: { type: "object" },
      force: { type: "boolean" },
      startCmd: { type: "string" },
      readyCmd: { type: "string" },
      steps: { type: "array", items: ref("TemplateStep") },
    },
  },
  BuildLogEntry: {
    type: "object",
    required: ["timestamp", "level", "message"],
    properties: {
      timestamp: { type: "string", format: "date-time" },
      level: { type: "string", enum: ["debug", "info", "warn", "error"] },
      message: { type: "string" },
      step: { type: "string", description: "base, 1..N, finalize" },
    },
  },
  TemplateBuildInfo: {
    type: "object",
    required: ["buildID", "templateID", "status", "logs", "logEntries"],
    properties: {
      buildID: { type: "string" },
      templateID: { type: "string" },
      status: { type: "string", enum: ["waiting", "building", "ready", "error"] },
      logs: strings,
      logEntries: { type: "array", items: ref("BuildLogEntry") },
      reason: {
        type: "object",
        properties: {
          message: { type: "string" },
          step: { type: "string" },
          logEntries: { type: "array", items: ref("BuildLogEntry") },
        },
      },
    },
  },
  Template: {
    type: "object",
    properties: {
      templateID: { type: "string" },
      buildID: { type: "string" },
      buildStatus: { type: "string" },
      cpuCount: { type: "integer" },
      memoryMB: { type: "integer" },
      diskSizeMB: { type: "integer" },
      envdVersion: { type: "string" },
      public: { type: "boolean" },
      names: strings,
      aliases: strings,
      createdAt: { type: "string", format: "date-time" },
      updatedAt: { type: "string", format: "date-time" },
      lastSpawnedAt: { type: ["string", "null"], format: "date-time" },
      spawnCount: { type: "integer" },
      buildCount: { type: "integer" },
    },
  },
};

export const TEMPLATE_PATHS: Record<string, unknown> = {
  "/v3/templates": {
    post: {
      summary: "Create a template (or a new build of yours with that name); the build waits for its trigger",
      requestBody: json(ref("TemplateBuildRequestV3")),
      responses: {
        202: json(ref("TemplateRequestResponseV3")),
        400: error("Name is required / Invalid name / Invalid tag / namespace must match your team / resources"),
        409: error("The alias is another template's ID"),
        429: error("Too many builds in progress for the team (Retry-After)"),
        ...auth,
      },
    },
  },
  "/v2/templates": {
    post: {
      summary: "Legacy create ({alias}); as /v3/templates",
      responses: { 202: json({ type: "object" }), 400: error("Bad request"), ...auth },
    },
    get: {
      summary: "The team's templates, newest first",
      responses: { 200: json({ type: "array", items: ref("Template") }) },
    },
  },
  "/templates": {
    get: {
      summary: "The team's templates, oldest first",
      responses: { 200: json({ type: "array", items: ref("Template") }) },
    },
  },
  "/templates/{templateID}/files/{hash}": {
    get: {
      summary: "The upload link of a COPY step's archive (present: the team has these files already)",
      parameters: [path("templateID"), path("hash")],
      responses: {
        201: json({
          type: "object",
          properties: { present: { type: "boolean" }, url: { type: "string" }, headers: { type: "object" } },
        }),
        400: error("Invalid files hash"),
        404: error("Unknown template (or another team's)"),
        ...auth,
      },
    },
  },
  "/warren/v1/template-uploads/{token}": {
    put: {
      summary: "Upload a COPY archive (tar or tar.gz) to the one-time link; no API key (the link authorizes it)",
      security: [],
      parameters: [path("token")],
      requestBody: { content: { "application/octet-stream": { schema: { type: "string", format: "binary" } } } },
      responses: {
        200: { description: "Stored" },
        400: error("Not a tar archive"),
        403: error("Invalid or expired link"),
        413: error("Larger than WARREN_TEMPLATE_UPLOAD_MAX_BYTES"),
      },
    },
  },
  "/v2/templates/{templateID}/builds/{buildID}": {
    post: {
      summary: "Start a waiting build with these steps (202 with an empty body)",
      parameters: [path("templateID"), path("buildID")],
      requestBody: json(ref("TemplateBuildStartV2")),
      responses: {
        202: { description: "Started (Content-Length: 0)" },
        400: error("Bad steps / Invalid build id / build is not in waiting state"),
        403: error("Another team's build"),
        404: error("Unknown template or build"),
        ...auth,
      },
    },
  },
  "/templates/{templateID}/builds/{buildID}/status": {
    get: {
      summary: "Build status with its log entries from logsOffset (at most 100)",
      parameters: [
        path("templateID"),
        path("buildID"),
        { name: "logsOffset", in: "query", schema: { type: "integer", minimum: 0 } },
        { name: "limit", in: "query", schema: { type: "integer", maximum: 100 } },
        { name: "level", in: "query", schema: { type: "string", enum: ["debug", "info", "warn", "error"] } },
      ],
      responses: {
        200: json(ref("TemplateBuildInfo")),
        400: error("Invalid build id / Build not found (E2B answers 400 for unknown builds)"),
        403: error("Another team's build"),
        ...auth,
      },
    },
  },
  "/templates/{templateID}/builds/{buildID}/logs": {
    get: {
      summary: "A build's log entries from cursor",
      parameters: [path("templateID"), path("buildID"), { name: "cursor", in: "query", schema: { type: "integer" } }],
      responses: {
        200: json({ type: "object", properties: { logs: { type: "array", items: ref("BuildLogEntry") } } }),
      },
    },
  },
  "/templates/aliases/{alias}": {
    get: {
      summary: "Whether a name exists (Template.exists); name:tag needs a ready build",
      parameters: [path("alias")],
      responses: {
        200: json({ type: "object", properties: { templateID: { type: "string" }, public: { type: "boolean" } } }),
        400: error("Invalid name or foreign namespace"),
        404: error("Not found"),
        ...auth,
      },
    },
  },
  "/templates/tags": {
    post: {
      summary: "Point tags at the build name:tag resolves to",
      requestBody: json({ type: "object", properties: { target: { type: "string" }, tags: strings } }),
      responses: {
        201: json({ type: "object", properties: { buildID: { type: "string" }, tags: strings } }),
        400: error("Bad target or tags"),
        403: error("Another team's template"),
        404: error("Unknown template or tag"),
      },
    },
    delete: {
      summary: "Remove tags (never default)",
      requestBody: json({ type: "object", properties: { name: { type: "string" }, tags: strings } }),
      responses: { 204: { description: "Removed" }, 400: error("Bad name or tags"), 404: error("Not found") },
    },
  },
  "/templates/{templateID}/tags": {
    get: {
      summary: "Every tag's newest assignment",
      parameters: [path("templateID")],
      responses: { 200: json({ type: "array", items: { type: "object" } }), 404: error("Not found") },
    },
  },
  "/templates/{templateID}": {
    get: {
      summary: "A template with its builds",
      parameters: [path("templateID")],
      responses: { 200: json(ref("Template")), 403: error("Another team's"), 404: error("Not found") },
    },
    patch: {
      summary: "Make a template public or private",
      parameters: [path("templateID")],
      requestBody: json({ type: "object", properties: { public: { type: "boolean" } } }),
      responses: { 200: json({}), 403: error("Another team's"), 404: error("Not found") },
    },
    delete: {
      summary:
        "Delete a team template (its name is free again; sandboxes made from it keep running) or a snapshot; Warren's shipped templates are not deletable",
      parameters: [path("templateID")],
      responses: { 204: { description: "Deleted" }, 403: error("Another team's"), 404: error("Not found") },
    },
  },
};
