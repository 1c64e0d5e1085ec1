/**
 * Warren's REST contract: the OpenAPI 3.1 document of proto/openapi/warren.yaml (E2B's paths and Warren's
 * /warren/v1 extras) and the types openapi-typescript generates from it. The api serves and validates with the
 * document; the api and the SDK take their request and response types from here, so neither restates the wire.
 */
import { openapiDocument } from "../gen/openapi-document.js";
import type { components, paths } from "../gen/openapi-types.js";

export type { components, operations, paths } from "../gen/openapi-types.js";

/** A JSON Schema of the document (2020-12, as OpenAPI 3.1 uses it). */
export type JsonSchema = { readonly [keyword: string]: unknown };

export interface OpenApiMediaType {
  readonly schema?: JsonSchema;
}

export interface OpenApiResponse {
  readonly description: string;
  readonly content?: { readonly [mediaType: string]: OpenApiMediaType };
}

export interface OpenApiOperation {
  readonly summary?: string;
  readonly parameters?: readonly { readonly name: string; readonly in: string; readonly schema?: JsonSchema }[];
  readonly requestBody?: { readonly content: { readonly [mediaType: string]: OpenApiMediaType } };
  readonly responses: { readonly [status: string]: OpenApiResponse };
}

export type HttpMethod = "get" | "put" | "post" | "delete" | "patch";

export interface OpenApiDocument {
  readonly openapi: string;
  readonly info: { readonly title: string; readonly version: string; readonly description?: string };
  readonly paths: { readonly [path: string]: { readonly [method in HttpMethod]?: OpenApiOperation } };
  readonly components: { readonly schemas: { readonly [name: string]: JsonSchema } };
}

export const OPENAPI_DOCUMENT = openapiDocument as OpenApiDocument;

/** A named schema of the document, e.g. `ApiSchema<"ListedSandbox">`. */
export type ApiSchema<Name extends keyof components["schemas"]> = components["schemas"][Name];

type JsonContent<T> = T extends { content: { "application/json": infer Body } } ? Body : never;
type RequestBodyOf<Op> = Op extends { requestBody?: infer Body } ? JsonContent<NonNullable<Body>> : never;
type ResponsesOf<Op> = Op extends { responses: infer Responses } ? Responses : never;

/** The JSON request body of an operation, e.g. `ApiRequestBody<"/v2/sandboxes", "post">`. */
export type ApiRequestBody<Path extends keyof paths, Method extends HttpMethod & keyof paths[Path]> = RequestBodyOf<
  paths[Path][Method]
>;

/** The JSON body of an operation's answer with a status, e.g. `ApiResponseBody<"/snapshots", "get", 200>`. */
export type ApiResponseBody<
  Path extends keyof paths,
  Method extends HttpMethod & keyof paths[Path],
  Status extends keyof ResponsesOf<paths[Path][Method]>,
> = JsonContent<ResponsesOf<paths[Path][Method]>[Status]>;
