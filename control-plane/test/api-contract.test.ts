import { type HttpMethod, OPENAPI_DOCUMENT } from "@warren/proto/openapi";
import { describe, expect, it } from "vitest";
import { API_SCHEMAS } from "../src/api/openapi-requests.js";
import { TEAM_EGRESS_MODES } from "../src/runtime/egress/policy.js";
import { SNAPSHOT_NAME } from "../src/store/snapshots.js";
import { VOLUME_NAME } from "../src/store/volumes.js";
import { documentedPath, expectDocumentedAnswer } from "./api-contract.js";

const json = new Headers({ "content-type": "application/json; charset=utf-8" });
const listed = {
  sandboxID: "sbx1",
  templateID: "base",
  clientID: "6532622b",
  startedAt: "2026-01-02T03:04:05.000Z",
  endAt: "2026-01-02T03:09:05.000Z",
  state: "running",
  cpuCount: 2,
  memoryMB: 512,
  diskSizeMB: 1024,
  envdVersion: "0.6.4",
  metadata: {},
  volumeMounts: [],
  nodeID: "node-a",
};

describe("answers checked against the OpenAPI document", () => {
  it("compiles every request and answer schema of the document (no dangling $ref)", () => {
    let compiled = 0;
    for (const [path, item] of Object.entries(OPENAPI_DOCUMENT.paths)) {
      for (const [method, operation] of Object.entries(item) as [
        HttpMethod,
        NonNullable<(typeof item)[HttpMethod]>,
      ][]) {
        if (API_SCHEMAS.requestBody(path, method)) compiled++;
        for (const status of Object.keys(operation.responses)) {
          if (API_SCHEMAS.responseBody(path, method, Number(status))) compiled++;
        }
      }
    }
    expect(compiled).toBeGreaterThan(100);
  });

  it("the document's name rules are the ones the stores apply", () => {
    const bodyProperty = (path: string, method: HttpMethod, name: string) =>
      (API_SCHEMAS.requestBodySchema(path, method)?.properties as Record<string, { pattern?: string }>)[name];
    expect(bodyProperty("/sandboxes/{sandboxID}/snapshots", "post", "name")?.pattern).toBe(SNAPSHOT_NAME.source);
    expect(bodyProperty("/volumes", "post", "name")?.pattern).toBe(VOLUME_NAME.source);
    const limits = API_SCHEMAS.resolve(OPENAPI_DOCUMENT.components.schemas.TeamLimits);
    expect((limits.properties as Record<string, { enum?: string[] }>).egressMode?.enum).toEqual([...TEAM_EGRESS_MODES]);
  });

  it("maps request paths to the document's templates, literal paths first", () => {
    expect(documentedPath("/sandboxes/metrics?sandbox_ids=a")).toBe("/sandboxes/metrics");
    expect(documentedPath("/sandboxes/sbx1")).toBe("/sandboxes/{sandboxID}");
    expect(documentedPath("/templates/tags")).toBe("/templates/tags");
    expect(documentedPath("/v9/nothing")).toBeUndefined();
  });

  it("accepts an answer that matches its schema", () => {
    expect(() =>
      expectDocumentedAnswer("GET", "/v2/sandboxes", { status: 200, headers: json, body: [listed] }),
    ).not.toThrow();
  });

  it("fails an answer whose body drifted: a wrong type, a missing required field, a value off its enum", () => {
    for (const drifted of [{ ...listed, cpuCount: "2" }, { ...listed, state: "sleeping" }, { sandboxID: "sbx1" }]) {
      expect(() =>
        expectDocumentedAnswer("GET", "/v2/sandboxes", { status: 200, headers: json, body: [drifted] }),
      ).toThrow(/off the document/);
    }
  });

  it("fails a success status the operation does not list, and a success on an undocumented path", () => {
    expect(() => expectDocumentedAnswer("GET", "/v2/sandboxes", { status: 201, headers: json, body: [] })).toThrow(
      /lists no 201/,
    );
    expect(() => expectDocumentedAnswer("GET", "/v9/nothing", { status: 200, headers: json, body: {} })).toThrow(
      /not in the document/,
    );
    expect(() => expectDocumentedAnswer("GET", "/v9/nothing", { status: 404, headers: json, body: {} })).not.toThrow();
  });
});
