/**
 * `npm run lint -w proto`: fails when openapi/warren.yaml breaks clients of the committed baseline
 * (baseline/openapi.json). After a deliberate break (a new API version), `npm run baseline -w proto` records it.
 */
import { readFile } from "node:fs/promises";
import { breakingChanges } from "./openapi-diff.mjs";
import { loadOpenApiDocument } from "./openapi-load.mjs";

const BASELINE = new URL("../baseline/openapi.json", import.meta.url);

const baseline = JSON.parse(await readFile(BASELINE, "utf8"));
const changes = breakingChanges(baseline, await loadOpenApiDocument());
if (changes.length > 0) {
  console.error(`openapi/warren.yaml breaks ${changes.length} thing(s) of baseline/openapi.json:`);
  for (const change of changes) console.error(`  ${change}`);
  process.exitCode = 1;
} else {
  console.log("openapi: no breaking change against baseline/openapi.json");
}
