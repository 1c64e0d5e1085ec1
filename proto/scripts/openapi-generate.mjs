/**
 * Generates the TypeScript side of the REST contract from openapi/warren.yaml (the one source):
 *   gen/openapi-document.ts  the document as a value (served as /openapi.json, compiled into validators)
 *   gen/openapi-types.ts     its types (openapi-typescript: `paths`, `components`, `operations`)
 * Run by `npm run generate` after buf (whose `clean: true` empties gen/ first).
 */
import { mkdir, writeFile } from "node:fs/promises";
import openapiTS, { astToString } from "openapi-typescript";
import { loadOpenApiDocument } from "./openapi-load.mjs";

const GEN = new URL("../gen/", import.meta.url);
const HEADER = "// Generated from proto/openapi/warren.yaml by proto/scripts/openapi-generate.mjs: do not edit.\n";

const document = await loadOpenApiDocument();
await mkdir(GEN, { recursive: true });
await writeFile(
  new URL("openapi-document.ts", GEN),
  `${HEADER}export const openapiDocument: unknown = ${JSON.stringify(document, null, 2)};\n`,
);
// openapi-typescript resolves $refs itself; it gets a copy because it annotates the object it walks.
const ast = await openapiTS(structuredClone(document), {
  defaultNonNullable: false,
  emptyObjectsUnknown: true,
  immutable: true,
  silent: true,
});
await writeFile(new URL("openapi-types.ts", GEN), `${HEADER}${astToString(ast)}`);
