import { type ApiRequestBody, type HttpMethod, OPENAPI_DOCUMENT, type paths } from "@warren/proto/openapi";
import type { ErrorObject } from "ajv";
import { badRequest } from "./errors.js";
import { fieldName, OpenApiValidators } from "./openapi-validator.js";

/** The api's validators, compiled from the served document (each operation's on first use). */
export const API_SCHEMAS = new OpenApiValidators(OPENAPI_DOCUMENT);

/** An ajv error in the api's words: the field, what it must be, and the value it got. */
function houseMessage(error: ErrorObject): string {
  const field = fieldName(error) || "request body";
  const schema = (error.parentSchema ?? {}) as { type?: unknown; minimum?: number; maximum?: number };
  const got = `got ${JSON.stringify(error.data)}`;
  if (error.keyword === "required") return `${field} is required`;
  if (schema.type === "integer" && schema.minimum !== undefined && schema.maximum !== undefined) {
    return `${field} must be an integer from ${schema.minimum} to ${schema.maximum}, ${got}`;
  }
  if (field === "request body" && error.keyword === "type") return "request body must be a JSON object";
  if (schema.type === "boolean") return `${field} must be a boolean, ${got}`;
  return `${field} ${error.message ?? "is invalid"}, ${got}`;
}

/** Top-level nulls dropped: the api reads a null field as one left out, as E2B's server does. */
function withoutNulls(value: unknown): unknown {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return value;
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null));
}

/**
 * A JSON request body checked against its operation's schema in the document: the typed body, or a 400 naming
 * the first field that is wrong. No body at all is an empty object (E2B's SDKs send none where all is optional).
 */
export function parseRequestBody<Path extends keyof paths, Method extends HttpMethod & keyof paths[Path]>(
  path: Path,
  method: Method,
  raw: unknown,
): NonNullable<ApiRequestBody<Path, Method>> {
  const value = withoutNulls(raw === undefined || raw === null ? {} : raw);
  const validate = API_SCHEMAS.requestBody(path, method);
  if (!validate) throw new Error(`the OpenAPI document has no JSON body for ${method.toUpperCase()} ${path}`);
  if (!validate(value)) {
    const first = validate.errors?.[0];
    throw badRequest(first ? houseMessage(first) : "request body is invalid");
  }
  return value as NonNullable<ApiRequestBody<Path, Method>>;
}
