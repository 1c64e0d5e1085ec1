import { readFile } from "node:fs/promises";
import { parse } from "yaml";

/** Where the REST contract lives: everything that describes Warren's REST API is generated from this file. */
export const OPENAPI_SOURCE = new URL("../openapi/warren.yaml", import.meta.url);

/** The OpenAPI document, parsed from its YAML source. */
export async function loadOpenApiDocument(source = OPENAPI_SOURCE) {
  const document = parse(await readFile(source, "utf8"));
  if (typeof document !== "object" || document === null || typeof document.paths !== "object") {
    throw new Error(`${source.pathname} is not an OpenAPI document (no paths)`);
  }
  return document;
}
