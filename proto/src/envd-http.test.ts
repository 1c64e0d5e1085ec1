import { describe, expect, it } from "vitest";
import { type EnvdInitBody, EnvdInitBodyError, parseEnvdEnvVars, parseEnvdInitBody } from "./envd-http.js";

function refusal(body: unknown): { field: string; message: string } {
  try {
    parseEnvdInitBody(body);
  } catch (error) {
    if (error instanceof EnvdInitBodyError) return { field: error.field, message: error.message };
    throw error;
  }
  throw new Error("the body was accepted");
}

describe("envd /init body", () => {
  it("parses what the node agent sends, the timestamp as a Date", () => {
    const sent: EnvdInitBody = {
      envVars: { A: "1", PATH_EXTRA: "/opt/bin" },
      accessToken: "token",
      defaultUser: "user",
      defaultWorkdir: "/home/user",
      timestamp: "2026-12-02T04:15:00.000Z",
    };
    expect(parseEnvdInitBody(JSON.parse(JSON.stringify(sent)))).toEqual({
      envVars: { A: "1", PATH_EXTRA: "/opt/bin" },
      accessToken: "token",
      defaultUser: "user",
      defaultWorkdir: "/home/user",
      timestamp: new Date("2026-12-02T04:15:00.000Z"),
    });
  });

  it("treats null as absent and ignores E2B's fields envd does not act on", () => {
    expect(parseEnvdInitBody({ envVars: null, accessToken: null, hyperloopIP: "10.0.0.1", volumeMounts: [] })).toEqual(
      {},
    );
  });

  it("keeps empty strings (an empty token clears it, an empty workdir means home)", () => {
    expect(parseEnvdInitBody({ accessToken: "", defaultWorkdir: "" })).toEqual({ accessToken: "", defaultWorkdir: "" });
  });

  it("refuses with the field named and envd's message", () => {
    expect(refusal([])).toEqual({ field: "body", message: "init body must be a JSON object" });
    expect(refusal(null)).toEqual({ field: "body", message: "init body must be a JSON object" });
    expect(refusal({ envVars: ["A=1"] })).toEqual({
      field: "envVars",
      message: "envVars must be an object of strings",
    });
    expect(refusal({ envVars: { A: 1 } })).toEqual({ field: "envVars.A", message: "envVars.A must be a string" });
    expect(refusal({ envVars: { "A=B": "1" } })).toEqual({
      field: "envVars.A=B",
      message: "invalid env var name 'A=B'",
    });
    expect(refusal({ envVars: { "": "1" } })).toEqual({ field: "envVars.", message: "invalid env var name ''" });
    expect(refusal({ accessToken: 7 })).toEqual({ field: "accessToken", message: "accessToken must be a string" });
    expect(refusal({ defaultUser: true })).toEqual({ field: "defaultUser", message: "defaultUser must be a string" });
    expect(refusal({ timestamp: "yesterday" })).toEqual({
      field: "timestamp",
      message: "timestamp must be an RFC 3339 date-time",
    });
    expect(refusal({ timestamp: 1764650000 })).toEqual({
      field: "timestamp",
      message: "timestamp must be an RFC 3339 date-time",
    });
  });
});

describe("envd /envs answer", () => {
  it("keeps string values and drops everything else", () => {
    expect(parseEnvdEnvVars({ A: "1", B: 2, C: null, D: "" })).toEqual({ A: "1", D: "" });
  });

  it("is no variables when the answer is not an object", () => {
    expect(parseEnvdEnvVars(null)).toEqual({});
    expect(parseEnvdEnvVars(["A"])).toEqual({});
    expect(parseEnvdEnvVars("A=1")).toEqual({});
  });
});
