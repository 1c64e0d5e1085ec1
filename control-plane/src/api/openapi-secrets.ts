/**
 * The secret paths of the OpenAPI document (E2B's `Secret` class of `e2b` 2.51.0) and Warren's per-command grant;
 * merged in openapi.ts. Values are write-only: no answer ever carries one.
 */

type Schema = Record<string, unknown>;
const ref = (name: string): Schema => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: Schema) => ({ content: { "application/json": { schema } } });
const error = (description: string) => ({ description, ...json(ref("Error")) });
const secretId = { name: "secretID", in: "path", required: true, schema: { type: "string" } };
const off = { 503: error("WARREN_SECRETS_KEYS is not set: secrets are off") };
const notFound = { 404: error("Not found (or another team's)") };
const body = json({
  type: "object",
  properties: {
    name: { type: "string" },
    value: { type: "string", description: "write-only, at most 32 KiB" },
    metadata: { type: "object", additionalProperties: { type: "string" } },
  },
});

export const SECRET_SCHEMAS: Record<string, Schema> = {
  Secret: {
    type: "object",
    properties: {
      id: { type: "string" },
      name: { type: "string" },
      metadata: { type: "object", additionalProperties: { type: "string" } },
      version: { type: "integer" },
      createdAt: { type: "string", format: "date-time" },
      updatedAt: { type: "string", format: "date-time" },
    },
  },
};

export const SECRET_PATHS = {
  "/secrets": {
    get: {
      summary: "The team's secrets (pages: limit, nextToken; X-Next-Token when more remain)",
      responses: { 200: json({ type: "array", items: ref("Secret") }), ...off },
    },
    post: {
      summary: "Create a secret (sealed at rest with AES-256-GCM)",
      requestBody: body,
      responses: { 201: json(ref("Secret")), 400: error("Bad name or value"), 409: error("Name taken"), ...off },
    },
  },
  "/secrets/{secretID}": {
    get: {
      summary: "A secret (id or name)",
      parameters: [secretId],
      responses: { 200: json(ref("Secret")), ...notFound, ...off },
    },
    post: {
      summary: "Update a secret's value or metadata",
      parameters: [secretId],
      requestBody: body,
      responses: { 200: json(ref("Secret")), ...notFound, ...off },
    },
    delete: {
      summary: "Destroy a secret",
      parameters: [secretId],
      responses: { 204: { description: "Destroyed" }, ...notFound },
    },
  },
  "/warren/v1/sandboxes/{sandboxID}/secret-grants": {
    post: {
      summary:
        "A one-time grant of secrets for one process start in the sandbox (Warren-Secret-Grant header of envd's Start)",
      parameters: [{ name: "sandboxID", in: "path", required: true, schema: { type: "string" } }],
      requestBody: json({
        type: "object",
        properties: {
          secrets: { type: "array", items: { type: "string" } },
          env: { type: "object", additionalProperties: { type: "string" } },
          ttlMs: { type: "integer" },
        },
      }),
      responses: {
        201: json({
          type: "object",
          properties: { grant: { type: "string" }, expiresAt: { type: "string" }, env: { type: "array" } },
        }),
        ...notFound,
        ...off,
      },
    },
  },
};
