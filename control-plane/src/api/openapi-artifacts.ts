/** The artifact paths of the OpenAPI document (api/artifacts.ts); merged in openapi.ts. */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const sandboxId = { name: "sandboxID", in: "path", required: true, schema: { type: "string" } };
const artifactId = { name: "artifactID", in: "path", required: true, schema: { type: "string" } };
const limit = { name: "limit", in: "query", schema: { type: "integer", minimum: 1, maximum: 1000, default: 100 } };
const notFound = { 404: error("Not found (or another team's)") };
const list = { 200: json({ type: "array", items: ref("Artifact") }) };

export const ARTIFACT_SCHEMAS: Record<string, Schema> = {
  Artifact: {
    type: "object",
    properties: {
      artifactID: { type: "string" },
      sandboxID: { type: "string" },
      path: { type: "string" },
      format: { enum: ["tar", "zip"] },
      sizeBytes: { type: "integer" },
      sha256: { type: "string", description: "hex digest of the archive" },
      createdAt: { type: "string", format: "date-time" },
    },
  },
};

export const ARTIFACT_PATHS = {
  "/warren/v1/sandboxes/{sandboxID}/artifacts": {
    post: {
      summary: "Freeze a file or folder of a running sandbox into a tar (or zip) kept outside it",
      parameters: [sandboxId],
      requestBody: json({
        type: "object",
        required: ["path"],
        properties: { path: { type: "string", description: "absolute" }, format: { enum: ["tar", "zip"] } },
      }),
      responses: {
        201: json(ref("Artifact")),
        400: error("Path not absolute, or a bad format"),
        404: error("Unknown sandbox (or another team's), or the path does not exist in it"),
        409: error("The sandbox is not running"),
        413: error("The archive exceeds WARREN_ARTIFACT_MAX_MB"),
      },
    },
    get: { summary: "This sandbox's artifacts, newest first", parameters: [sandboxId, limit], responses: list },
  },
  "/warren/v1/artifacts": {
    get: { summary: "The team's artifacts, newest first", parameters: [limit], responses: list },
  },
  "/warren/v1/artifacts/{artifactID}": {
    get: { summary: "An artifact", parameters: [artifactId], responses: { 200: json(ref("Artifact")), ...notFound } },
    delete: {
      summary: "Delete an artifact (its bytes go with the last artifact of that digest)",
      parameters: [artifactId],
      responses: { 204: { description: "Deleted" }, ...notFound },
    },
  },
  "/warren/v1/artifacts/{artifactID}/url": {
    post: {
      summary: "A signed download URL that needs no API key",
      parameters: [artifactId],
      requestBody: json({ type: "object", properties: { expiresInSeconds: { type: "integer", maximum: 86400 } } }),
      responses: {
        201: json({
          type: "object",
          properties: {
            path: { type: "string" },
            url: { type: "string" },
            expiresAt: { type: "string", format: "date-time" },
          },
        }),
        ...notFound,
        503: error("No signing key (WARREN_ARTIFACT_URL_KEY or WARREN_INTERNAL_TOKEN)"),
      },
    },
  },
  "/warren/v1/artifacts/{artifactID}/download": {
    get: {
      summary: "The artifact's bytes (signed URL; works after the sandbox is gone)",
      security: [],
      parameters: [
        artifactId,
        { name: "expires", in: "query", required: true, schema: { type: "integer" } },
        { name: "sig", in: "query", required: true, schema: { type: "string" } },
      ],
      responses: {
        200: {
          description: "The archive",
          content: { "application/x-tar": {}, "application/zip": {} },
        },
        403: error("Expired, or not signed for this artifact"),
        404: error("Deleted"),
      },
    },
  },
};
