/** `npm run baseline -w proto`: records the current OpenAPI document as the one later changes are checked against. */
import { execFileSync } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { loadOpenApiDocument } from "./openapi-load.mjs";

const BASELINE = fileURLToPath(new URL("../baseline/openapi.json", import.meta.url));
await writeFile(BASELINE, `${JSON.stringify(await loadOpenApiDocument(), null, 2)}\n`);
// Formatted as the repository's `biome check .` wants every JSON file.
execFileSync("npx", ["--no-install", "biome", "format", "--write", BASELINE], { stdio: "inherit" });
console.log(`wrote ${BASELINE}`);
