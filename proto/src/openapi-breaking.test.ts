import { readFile } from "node:fs/promises";
import { describe, expect, it } from "vitest";
// @ts-expect-error: a plain ESM script (run by `npm run lint` before any build), no declarations.
import { breakingChanges } from "../scripts/openapi-diff.mjs";
// @ts-expect-error: as above.
import { loadOpenApiDocument } from "../scripts/openapi-load.mjs";

type Doc = Record<string, unknown> & { paths: Record<string, Record<string, Record<string, unknown>>> };
/** The breaking changes, sorted: the check reports them in document order, the tests name them in any. */
const sorted = (lines: string[]) => [...lines].sort();
const diff = (before: Doc, after: Doc) => (breakingChanges as (b: Doc, a: Doc) => string[])(before, after).sort();

const error = { $ref: "#/components/schemas/Error" };
const json = (schema: unknown) => ({ content: { "application/json": { schema } } });

/** A small document: one create (request body + 201 answer) and one list, as the real one is built. */
function document(): Doc {
  return {
    openapi: "3.1.0",
    info: { title: "t", version: "1" },
    components: {
      schemas: {
        Error: { type: "object", properties: { code: { type: "integer" }, message: { type: "string" } } },
        Thing: {
          type: "object",
          required: ["id", "state"],
          properties: {
            id: { type: "string" },
            state: { type: "string", enum: ["running", "paused"] },
            size: { type: "integer" },
          },
        },
      },
    },
    paths: {
      "/things": {
        post: {
          requestBody: json({
            type: "object",
            required: ["name"],
            properties: { name: { type: "string" }, count: { type: "integer" }, mode: { enum: ["a", "b"] } },
          }),
          responses: { 201: { description: "Created", ...json({ $ref: "#/components/schemas/Thing" }) } },
        },
        get: {
          parameters: [{ name: "limit", in: "query", schema: { type: "integer" } }],
          responses: {
            200: { description: "OK", ...json({ type: "array", items: { $ref: "#/components/schemas/Thing" } }) },
            400: { description: "Bad", ...json(error) },
          },
        },
      },
    },
  };
}

/** The document after `change`, applied to a fresh copy. */
function changed(change: (doc: Doc) => void): Doc {
  const doc = document();
  change(doc);
  return doc;
}

const schemas = (doc: Doc) => (doc.components as { schemas: Record<string, Record<string, unknown>> }).schemas;
const thing = (doc: Doc) => schemas(doc).Thing as { properties: Record<string, unknown>; required: string[] };
const createBody = (doc: Doc) =>
  (doc.paths["/things"]?.post?.requestBody as { content: { "application/json": { schema: Record<string, unknown> } } })
    .content["application/json"].schema as { properties: Record<string, unknown>; required: string[] };

describe("OpenAPI breaking-change check", () => {
  it("finds nothing between a document and itself, nor in additions", () => {
    expect(diff(document(), document())).toEqual([]);
    const added = changed((doc) => {
      thing(doc).properties.extra = { type: "string" };
      createBody(doc).properties.note = { type: "string" };
      (doc.paths["/things"] as Record<string, unknown>).delete = { responses: { 204: { description: "Gone" } } };
      (doc.paths["/things"]?.get?.responses as Record<string, unknown>)[404] = { description: "None", ...json(error) };
      thing(doc).required.push("size");
    });
    expect(diff(document(), added)).toEqual([]);
  });

  it("reports a removed operation and a removed answer status", () => {
    const removed = changed((doc) => {
      delete (doc.paths["/things"] as Record<string, unknown>).post;
      delete (doc.paths["/things"]?.get?.responses as Record<string, unknown>)[400];
    });
    expect(diff(document(), removed)).toEqual(
      sorted(["POST /things: operation removed", "GET /things 400: answer removed"]),
    );
  });

  it("reports removed properties of requests and answers, also behind $refs and in list items", () => {
    const removed = changed((doc) => {
      delete thing(doc).properties.size;
      delete createBody(doc).properties.count;
    });
    expect(diff(document(), removed)).toEqual(
      sorted([
        "POST /things request.count: removed",
        "POST /things 201.size: removed",
        "GET /things 200[].size: removed",
      ]),
    );
  });

  it("reports a request property or parameter that became required, and an answer property that stopped being", () => {
    const stricter = changed((doc) => {
      createBody(doc).required.push("count");
      (doc.paths["/things"]?.get?.parameters as { required?: boolean }[])[0]!.required = true;
      thing(doc).required = ["id"];
    });
    expect(diff(document(), stricter)).toEqual(
      sorted([
        "GET /things query parameter limit: became required",
        "GET /things 200[].state: no longer always answered (not required)",
        "POST /things request.count: became required",
        "POST /things 201.state: no longer always answered (not required)",
      ]),
    );
  });

  it("reports type and enum changes in the direction that breaks clients", () => {
    const retyped = changed((doc) => {
      createBody(doc).properties.count = { type: "string" };
      createBody(doc).properties.mode = { enum: ["a"] };
      thing(doc).properties.size = { type: ["integer", "null"] };
      thing(doc).properties.state = { type: "string", enum: ["running", "paused", "lost"] };
    });
    expect(diff(document(), retyped)).toEqual(
      sorted([
        "POST /things request.count: no longer accepts type integer",
        'POST /things request.mode: no longer accepts "b"',
        'POST /things 201.state: may now answer "lost"',
        "POST /things 201.size: may now be of type null",
        'GET /things 200[].state: may now answer "lost"',
        "GET /things 200[].size: may now be of type null",
      ]),
    );
    const widened = changed((doc) => {
      createBody(doc).properties.count = { type: "number" };
      createBody(doc).properties.mode = { enum: ["a", "b", "c"] };
    });
    expect(diff(document(), widened)).toEqual([]);
  });

  it("the committed baseline holds: openapi/warren.yaml breaks nothing of baseline/openapi.json", async () => {
    const baseline = JSON.parse(await readFile(new URL("../baseline/openapi.json", import.meta.url), "utf8")) as Doc;
    expect(diff(baseline, (await loadOpenApiDocument()) as Doc)).toEqual([]);
  });
});
