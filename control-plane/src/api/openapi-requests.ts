import {
  type ApiRequestBody,
  type HttpMethod,
  type JsonSchema,
  OPENAPI_DOCUMENT,
  type paths,
} from "@warren/proto/openapi";
import type { ErrorObject } from "ajv";
import { badRequest } from "./errors.js";
import { fieldName, OpenApiValidators } from "./openapi-validator.js";

/** The api's validators, compiled from the served document (each operation's on first use). */
export const API_SCHEMAS = new OpenApiValidators(OPENAPI_DOCUMENT);

/** One thing the document's schema found wrong with a request body, for a route that words it its own way. */
export interface BodyProblem {
  /** The field as messages name it (`network.allowOut[2]`); "" for the body itself. */
  readonly field: string;
  /** The JSON Schema keyword that refused it (`required`, `type`, `minimum`, `pattern`, `propertyNames`, …). */
  readonly keyword: string;
  /** The value refused (for `propertyNames`, the key); undefined when the field is missing. */
  readonly value: unknown;
}

/** A route's own words for some problems (E2B's messages); undefined leaves the api's usual wording. */
export type BodyWords = (problem: BodyProblem) => string | undefined;

const ARTICLES: Record<string, string> = {
  object: "an object",
  array: "an array",
  string: "a string",
  integer: "an integer",
  number: "a number",
  boolean: "a boolean",
  null: "null",
};

interface SchemaWords {
  readonly type?: unknown;
  readonly minimum?: number;
  readonly maximum?: number;
  readonly format?: string;
  readonly enum?: readonly unknown[];
  readonly writeOnly?: boolean;
  /** The document's words for a value this schema refuses, after the field's name ("must be an array of strings"). */
  readonly "x-message"?: string;
}

/** The refused value as a message shows it: short, and never a write-only one (a secret's value). */
function shown(value: unknown, schema: SchemaWords): string {
  if (schema.writeOnly) return "";
  const text = JSON.stringify(value) ?? String(value);
  return `, got ${text.length > 120 ? `${text.slice(0, 120)}…` : text}`;
}

function typeWords(type: unknown): string {
  const types = Array.isArray(type) ? type : [type];
  return types.map((t) => ARTICLES[String(t)] ?? String(t)).join(" or ");
}

/** What the schema found, as a problem a route may word. */
function problemOf(error: ErrorObject): BodyProblem {
  const field = fieldName(error);
  if (error.schemaPath.includes("/propertyNames/")) return { field, keyword: "propertyNames", value: error.data };
  if (error.keyword === "required") return { field, keyword: "required", value: undefined };
  const extra = (error.params as { additionalProperty?: string }).additionalProperty;
  if (error.keyword === "additionalProperties" && extra !== undefined) {
    return { field: field ? `${field}.${extra}` : extra, keyword: "additionalProperties", value: undefined };
  }
  return { field, keyword: error.keyword, value: error.data };
}

/** An ajv error in the api's words: the field, what it must be, and the value it got. */
function houseMessage(error: ErrorObject, problem: BodyProblem): string {
  const { field, keyword, value } = problem;
  const name = field || "request body";
  const schema = (error.parentSchema ?? {}) as SchemaWords;
  const limit = (error.params as { limit?: number }).limit;
  if (keyword === "propertyNames") {
    return `${name}: ${JSON.stringify(value)?.replace(/^"|"$/g, "'")} ${schema["x-message"] ?? "is not an allowed name"}`;
  }
  switch (keyword) {
    case "required":
      return `${name} is required`;
    case "additionalProperties":
      return `${name} is not a field of this request`;
    case "minLength":
      return limit === 1 ? `${name} must not be empty` : `${name} must be at least ${limit} characters long`;
    case "maxLength":
      return `${name} must be at most ${limit} characters long`;
    case "minItems":
    case "minProperties":
      return limit === 1 ? `${name} must not be empty` : `${name} must have at least ${limit} entries`;
    case "maxItems":
    case "maxProperties":
      return `${name} must have at most ${limit} entries, got ${Object.keys(value ?? {}).length}`;
  }
  // Past the counts: what the value must be, in the document's words where it has them.
  if (!field && keyword === "type") return "request body must be a JSON object";
  const got = shown(value, schema);
  if (schema["x-message"]) return `${name} ${schema["x-message"]}${got}`;
  const ranged = schema.type === "integer" && schema.minimum !== undefined && schema.maximum !== undefined;
  if (ranged && ["type", "minimum", "maximum", "format"].includes(keyword)) {
    return `${name} must be an integer from ${schema.minimum} to ${schema.maximum}${got}`;
  }
  if (schema.format === "int32" && (keyword === "type" || keyword === "format")) {
    return `${name} must be a 32-bit integer${got}`;
  }
  switch (keyword) {
    case "type":
      return `${name} must be ${typeWords(schema.type)}${got}`;
    case "minimum":
      return `${name} must be at least ${schema.minimum}${got}`;
    case "maximum":
      return `${name} must be at most ${schema.maximum}${got}`;
    case "enum":
      return `${name} must be one of ${(schema.enum ?? []).map((v) => JSON.stringify(v)).join(", ")}${got}`;
    case "pattern":
      return `${name} must match ${(error.params as { pattern?: string }).pattern}${got}`;
    default:
      return `${name} ${error.message ?? "is invalid"}${got}`;
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The properties a schema names (through `$ref` and `allOf`), each with its schema. */
function namedProperties(schema: JsonSchema | undefined): Map<string, JsonSchema> {
  const resolved = API_SCHEMAS.resolve(schema);
  const named = new Map(Object.entries((resolved.properties ?? {}) as Record<string, JsonSchema>));
  for (const part of (resolved.allOf ?? []) as JsonSchema[]) {
    for (const [key, property] of namedProperties(part)) if (!named.has(key)) named.set(key, property);
  }
  return named;
}

/**
 * Nulls in the properties a schema names dropped, at every depth: the api reads such a null as the field left out,
 * as E2B's server (Go, pointers and slices) does. Values of a map (`additionalProperties`) and array items are not
 * fields: a null there stays, and is refused where the schema wants something else.
 */
function withoutNamedNulls(value: unknown, schema: JsonSchema | undefined): unknown {
  const resolved = API_SCHEMAS.resolve(schema);
  if (Array.isArray(value)) {
    const items = resolved.items as JsonSchema | undefined;
    return items ? value.map((item) => withoutNamedNulls(item, items)) : value;
  }
  if (!isObject(value)) return value;
  const named = namedProperties(resolved);
  if (named.size === 0) return value;
  // fromEntries defines every key as the object's own, `__proto__` included (an assignment would set the prototype).
  return Object.fromEntries(
    Object.entries(value).flatMap(([key, item]): [string, unknown][] => {
      const property = named.get(key);
      if (property === undefined) return [[key, item]];
      return item === null ? [] : [[key, withoutNamedNulls(item, property)]];
    }),
  );
}

/**
 * A JSON request body checked against its operation's schema in the document: the typed body, or a 400 naming the
 * first field that is wrong (in the route's `words` where it has its own, else the api's). No body at all is an
 * empty object (E2B's SDKs send none where all is optional); a null field is one left out.
 */
export function parseRequestBody<Path extends keyof paths, Method extends HttpMethod & keyof paths[Path]>(
  path: Path,
  method: Method,
  raw: unknown,
  words?: BodyWords,
): NonNullable<ApiRequestBody<Path, Method>> {
  const schema = API_SCHEMAS.requestBodySchema(path, method);
  const validate = API_SCHEMAS.requestBody(path, method);
  if (!schema || !validate)
    throw new Error(`the OpenAPI document has no JSON body for ${method.toUpperCase()} ${path}`);
  const value = withoutNamedNulls(raw === undefined || raw === null ? {} : raw, schema);
  if (!validate(value)) {
    const first = validate.errors?.[0];
    if (!first) throw badRequest("request body is invalid");
    const problem = problemOf(first);
    throw badRequest(words?.(problem) ?? houseMessage(first, problem));
  }
  return value as NonNullable<ApiRequestBody<Path, Method>>;
}
