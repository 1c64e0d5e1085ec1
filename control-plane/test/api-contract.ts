/**
 * Checks the api's answers against the OpenAPI document it serves: the operation must list the status, and a JSON
 * body must match that answer's schema. A route whose output drifts from the document fails the test that called it.
 */
import { type HttpMethod, OPENAPI_DOCUMENT } from "@warren/proto/openapi";
import { API_SCHEMAS } from "../src/api/openapi-requests.js";

interface DocumentedPath {
  readonly template: string;
  readonly pattern: RegExp;
  readonly params: number;
}

/** Literal paths before templated ones, so `/sandboxes/metrics` is not taken for `/sandboxes/{sandboxID}`. */
const DOCUMENTED_PATHS: readonly DocumentedPath[] = Object.keys(OPENAPI_DOCUMENT.paths)
  .map((template) => ({
    template,
    pattern: new RegExp(`^${template.replace(/[.*+?^$()|[\]\\]/g, "\\$&").replace(/\{[^}]+\}/g, "[^/]+")}$`),
    params: (template.match(/\{/g) ?? []).length,
  }))
  .sort((a, b) => a.params - b.params);

/** The document's path template of a request path (query left out), or undefined for an undocumented path. */
export function documentedPath(path: string): string | undefined {
  const bare = path.split("?")[0] ?? path;
  return DOCUMENTED_PATHS.find((p) => p.pattern.test(bare))?.template;
}

/**
 * Throws when the answer is not what the document says `method path` answers. Error answers are checked when the
 * document lists their status; a success on an undocumented path is an error (every route the api serves is in
 * the document).
 */
export function expectDocumentedAnswer(
  method: string,
  path: string,
  answer: { status: number; headers: Headers; body: unknown },
): void {
  const template = documentedPath(path);
  const verb = method.toLowerCase() as HttpMethod;
  const operation = template ? OPENAPI_DOCUMENT.paths[template]?.[verb] : undefined;
  if (!template || !operation) {
    // Unknown paths and methods answer errors; a success there is a route the document is missing.
    if (answer.status < 400) throw new Error(`${method} ${path} answered ${answer.status} but is not in the document`);
    return;
  }
  const listed = operation.responses[String(answer.status)] !== undefined;
  if (!listed && answer.status >= 400) return;
  const validate = API_SCHEMAS.responseBody(template, verb, answer.status);
  const json = answer.headers.get("content-type")?.startsWith("application/json") ?? false;
  if (!validate || !json) return;
  if (!validate(answer.body)) {
    const errors = (validate.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message}`).join("; ");
    throw new Error(`${method} ${path} answered ${answer.status} off the document (${template}): ${errors}`);
  }
}
