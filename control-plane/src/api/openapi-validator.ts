import type { HttpMethod, JsonSchema, OpenApiDocument } from "@warren/proto/openapi";
import type { ErrorObject, ValidateFunction } from "ajv";
import { Ajv2020 } from "ajv/dist/2020.js";

/**
 * JSON Schema validators compiled from the OpenAPI document's own schemas (ajv, draft 2020-12 as OpenAPI 3.1 uses
 * it): the api checks request bodies with them, and the tests check every answer they read against them.
 */

const DOCUMENT_ID = "warren-openapi";
const ISO_DATE_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/i;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** A JSON pointer segment (RFC 6901): `/` and `~` escaped. */
function pointer(segment: string): string {
  return segment.replace(/~/g, "~0").replace(/\//g, "~1");
}

export class OpenApiValidators {
  private readonly ajv: Ajv2020;
  private readonly compiled = new Map<string, ValidateFunction>();

  constructor(private readonly document: OpenApiDocument) {
    // Not strict: the document carries OpenAPI's own keywords (`example`, formats such as int32) beside JSON Schema.
    this.ajv = new Ajv2020({ strict: false, allErrors: true, verbose: true });
    this.ajv.addFormat("date-time", {
      type: "string",
      validate: (s) => ISO_DATE_TIME.test(s) && !Number.isNaN(Date.parse(s)),
    });
    this.ajv.addFormat("uuid", UUID);
    this.ajv.addFormat("int32", { type: "number", validate: (n) => Number.isInteger(n) && Math.abs(n) <= 2 ** 31 - 1 });
    this.ajv.addFormat("binary", true);
    // The whole document under one id, so that schemas inside operations resolve their `#/components/...` refs.
    this.ajv.addSchema(document as object, DOCUMENT_ID);
  }

  /** The schema of an operation's JSON request body as the document writes it; undefined when it has none. */
  requestBodySchema(path: string, method: HttpMethod): JsonSchema | undefined {
    return this.document.paths[path]?.[method]?.requestBody?.content["application/json"]?.schema;
  }

  /** The validator of an operation's JSON request body; undefined when the document gives it none. */
  requestBody(path: string, method: HttpMethod): ValidateFunction | undefined {
    if (!this.requestBodySchema(path, method)) return undefined;
    return this.at(`/paths/${pointer(path)}/${method}/requestBody/content/application~1json/schema`);
  }

  /** A schema with its `$ref`s to the document's own components followed (`{}` for one that leads nowhere). */
  resolve(schema: JsonSchema | undefined): JsonSchema {
    let current = schema;
    for (let hops = 0; typeof current?.$ref === "string" && hops < 32; hops++) {
      const segments = (current.$ref as string).replace(/^#\//, "").split("/");
      current = segments.reduce<unknown>(
        (node, s) => (node as Record<string, unknown> | undefined)?.[s.replace(/~1/g, "/").replace(/~0/g, "~")],
        this.document,
      ) as JsonSchema | undefined;
    }
    return current ?? {};
  }

  /**
   * The validator of an operation's JSON answer with this status; undefined when the document has no JSON body
   * for it. Throws when the document does not list the status at all: an answer the contract does not know.
   */
  responseBody(path: string, method: HttpMethod, status: number): ValidateFunction | undefined {
    const operation = this.document.paths[path]?.[method];
    if (!operation) throw new Error(`the OpenAPI document has no operation ${method.toUpperCase()} ${path}`);
    const response = operation.responses[String(status)];
    if (!response) {
      throw new Error(`the OpenAPI document lists no ${status} answer for ${method.toUpperCase()} ${path}`);
    }
    if (!response.content?.["application/json"]?.schema) return undefined;
    return this.at(`/paths/${pointer(path)}/${method}/responses/${status}/content/application~1json/schema`);
  }

  private at(jsonPointer: string): ValidateFunction {
    let validate = this.compiled.get(jsonPointer);
    if (!validate) {
      validate = this.ajv.compile({ $ref: `${DOCUMENT_ID}#${jsonPointer}` });
      this.compiled.set(jsonPointer, validate);
    }
    return validate;
  }
}

/** A field path as the api's messages name it (`network.allowOut[2]`), from ajv's instance path. */
export function fieldName(error: ErrorObject): string {
  const segments = error.instancePath.split("/").slice(1);
  if (error.keyword === "required") segments.push(String(error.params.missingProperty));
  return segments
    .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"))
    .reduce((name, s) => (/^\d+$/.test(s) ? `${name}[${s}]` : name ? `${name}.${s}` : s), "");
}
