/**
 * The volume paths of the OpenAPI document (E2B's `Volume` class of `e2b` 2.51.0; shared/E2B-TEMPLATES.md §8):
 * the control plane (API key) and the content API (the volume's bearer token); merged in openapi.ts.
 */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const volumeId = { name: "volumeID", in: "path", required: true, schema: { type: "string", format: "uuid" } };
const query = (name: string, schema: Schema, required = false) => ({ name, in: "query", required, schema });
const pathParam = query("path", { type: "string" }, true);
const owner = [
  query("uid", { type: "integer" }),
  query("gid", { type: "integer" }),
  query("mode", { type: "integer" }),
];
const bearer = [{ VolumeToken: [] }];
const contentErrors = {
  400: error("Bad path or parameter"),
  401: error("Missing, invalid or expired volume token"),
  404: error("Path not found"),
};

export const VOLUME_SCHEMAS: Record<string, Schema> = {
  VolumeAndToken: {
    type: "object",
    required: ["volumeID", "name", "token"],
    properties: {
      volumeID: { type: "string", format: "uuid" },
      name: { type: "string" },
      token: { type: "string", description: "for the content API; a fresh one at every create, info, connect" },
    },
  },
  VolumeEntryStat: {
    type: "object",
    properties: {
      name: { type: "string" },
      path: { type: "string" },
      type: { enum: ["file", "directory", "symlink", "unknown"] },
      size: { type: "integer" },
      mode: { type: "integer" },
      uid: { type: "integer" },
      gid: { type: "integer" },
      atime: { type: "string", format: "date-time" },
      mtime: { type: "string", format: "date-time" },
      ctime: { type: "string", format: "date-time" },
      target: { type: "string" },
    },
  },
};

export const VOLUME_SECURITY_SCHEMES = {
  VolumeToken: { type: "http", scheme: "bearer", description: "a volume's content-API token" },
};

export const VOLUME_PATHS = {
  "/volumes": {
    post: {
      summary: "Create a volume (name: letters, digits, '_', '-')",
      requestBody: json({ type: "object", required: ["name"], properties: { name: { type: "string" } } }),
      responses: {
        201: { description: "Created", ...json(ref("VolumeAndToken")) },
        400: error("Invalid name, or the team has a volume of that name"),
        403: error("Volumes are not enabled on this deployment"),
      },
    },
    get: {
      summary: "The team's volumes",
      responses: {
        200: {
          description: "OK",
          ...json({
            type: "array",
            items: { type: "object", properties: { volumeID: { type: "string" }, name: { type: "string" } } },
          }),
        },
      },
    },
  },
  "/volumes/{volumeID}": {
    get: {
      summary: "A volume, with a fresh content-API token",
      parameters: [volumeId],
      responses: {
        200: { description: "OK", ...json(ref("VolumeAndToken")) },
        400: error("Not a UUID"),
        404: error("Not found (or another team's)"),
      },
    },
    delete: {
      summary: "Destroy a volume (its files go at once)",
      parameters: [volumeId],
      responses: { 204: { description: "Destroyed" }, 404: error("Not found (or another team's)") },
    },
  },
  "/volumecontent/{volumeID}/dir": {
    get: {
      summary: "List a folder (depth 1-10)",
      security: bearer,
      parameters: [volumeId, pathParam, query("depth", { type: "integer", minimum: 1, maximum: 10 })],
      responses: { 200: json({ type: "array", items: ref("VolumeEntryStat") }), ...contentErrors },
    },
    post: {
      summary: "Make a folder (force: parents too, an existing folder is fine)",
      security: bearer,
      parameters: [volumeId, pathParam, ...owner, query("force", { type: "boolean" })],
      responses: { 201: json(ref("VolumeEntryStat")), 409: error("Exists"), ...contentErrors },
    },
  },
  "/volumecontent/{volumeID}/path": {
    get: {
      summary: "Stat an entry",
      security: bearer,
      parameters: [volumeId, pathParam],
      responses: { 200: json(ref("VolumeEntryStat")), ...contentErrors },
    },
    patch: {
      summary: "Change mode and owner",
      security: bearer,
      parameters: [volumeId, pathParam],
      requestBody: json({
        type: "object",
        properties: { uid: { type: "integer" }, gid: { type: "integer" }, mode: { type: "integer" } },
      }),
      responses: { 200: json(ref("VolumeEntryStat")), ...contentErrors },
    },
    delete: {
      summary: "Remove an entry (folders recursively)",
      security: bearer,
      parameters: [volumeId, pathParam],
      responses: { 204: { description: "Removed" }, ...contentErrors },
    },
  },
  "/volumecontent/{volumeID}/file": {
    get: {
      summary: "Read a file",
      security: bearer,
      parameters: [volumeId, pathParam],
      responses: {
        200: { description: "The bytes", content: { "application/octet-stream": { schema: { type: "string" } } } },
        ...contentErrors,
      },
    },
    put: {
      summary: "Write a file (without force: an exclusive create; force: parents too, truncates)",
      security: bearer,
      parameters: [volumeId, pathParam, ...owner, query("force", { type: "boolean" })],
      requestBody: { content: { "application/octet-stream": { schema: { type: "string", format: "binary" } } } },
      responses: {
        201: json(ref("VolumeEntryStat")),
        409: error("Exists"),
        507: error("The volume's quota would be exceeded"),
        ...contentErrors,
      },
    },
  },
};
