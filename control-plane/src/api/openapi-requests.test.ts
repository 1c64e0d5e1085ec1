import { describe, expect, it } from "vitest";
import { ApiError } from "./errors.js";
import { parseRequestBody } from "./openapi-requests.js";
import { parseConnectBody, parseCreateBody, parseNetworkUpdate, parseTimeoutBody } from "./validate.js";

/** The 400's message of a refused body (fails when the body is accepted). */
function refusal(parse: () => unknown): string {
  try {
    parse();
  } catch (error) {
    expect(error).toBeInstanceOf(ApiError);
    expect((error as ApiError).status).toBe(400);
    return (error as ApiError).message;
  }
  throw new Error("the body was accepted");
}

const create = (body: unknown) => parseCreateBody(body, 2);

describe("request bodies checked against the document's schemas", () => {
  it("words each kind of refusal with the field and the value it got", () => {
    expect(refusal(() => create({}))).toBe("templateID is required");
    expect(refusal(() => create([1]))).toBe("request body must be a JSON object");
    expect(refusal(() => create({ templateID: "base", autoPause: "yes" }))).toBe(
      'autoPause must be a boolean, got "yes"',
    );
    expect(refusal(() => create({ templateID: "base", timeout: 1.5 }))).toBe(
      "timeout must be a 32-bit integer, got 1.5",
    );
    expect(refusal(() => create({ templateID: "base", timeout: 2 ** 31 }))).toBe(
      "timeout must be a 32-bit integer, got 2147483648",
    );
    expect(refusal(() => create({ templateID: "base", metadata: { a: 1 } }))).toBe(
      "metadata.a must be a string, got 1",
    );
    expect(refusal(() => create({ templateID: "base", volumeMounts: [{ name: "v" }] }))).toBe(
      "volumeMounts[0].path is required",
    );
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`s${i}`, {}]));
    expect(refusal(() => create({ templateID: "base", mcp: many }))).toBe("mcp must have at most 64 entries, got 65");
  });

  it("uses the document's x-message for what a value must be, and for keys", () => {
    expect(refusal(() => create({ templateID: "bad template!" }))).toBe(
      'templateID is not a valid template reference, got "bad template!"',
    );
    expect(refusal(() => create({ templateID: "base", envVars: "x" }))).toBe(
      'envVars must be an object of strings, got "x"',
    );
    expect(refusal(() => create({ templateID: "base", envVars: { "A=B": "x" } }))).toBe(
      "envVars: 'A=B' is not a valid variable name (letters, digits and '_', not starting with a digit)",
    );
    expect(refusal(() => parseNetworkUpdate({ allowOut: "1.1.1.1" }))).toBe(
      'allowOut must be an array of strings, got "1.1.1.1"',
    );
  });

  it("keeps E2B's own words where the SDKs show them, and the rules a schema cannot say", () => {
    expect(refusal(() => create({ templateID: "base", timeout: 0 }))).toBe("Timeout must be greater than 0");
    expect(refusal(() => parseCreateBody({ templateID: "base", timeout: -5 }, 1))).toBe(
      "Timeout must be greater than 0",
    );
    expect(refusal(() => parseConnectBody({}, 1))).toBe("timeout is required");
    expect(refusal(() => parseTimeoutBody({}))).toBe("timeout is required");
    expect(refusal(() => create({ templateID: "base", autoResume: { enabled: true } }))).toBe(
      "autoResume requires autoPause to be true.",
    );
    expect(refusal(() => create({ templateID: "base", network: { egressProxy: { password: "hunter2" } } }))).toBe(
      "network.egressProxy (SOCKS5 egress) is not supported by this server",
    );
    expect(refusal(() => parseNetworkUpdate({ rules: { "example.com": [{}] } }))).toBe(
      "network.rules (HTTP header transforms on egress) is not supported by this server",
    );
    expect(refusal(() => create({ templateID: "base", volumeMounts: [{ name: "", path: "rel" }] }))).toBe(
      "invalid mounts:\n\t- volume mount #0: volume name cannot be empty\n\t- volume mount #0: path must be absolute",
    );
  });

  it("never shows a write-only value, and cuts long ones", () => {
    const secret = refusal(() => parseRequestBody("/secrets", "post", { name: "db", value: 5 }));
    expect(secret).toBe("value must be a string");
    const long = refusal(() => create({ templateID: "x".repeat(500) }));
    expect(long.length).toBeLessThan(200);
  });

  it("reads a null in a named field as the field left out, at any depth, but not in a map or a list", () => {
    const parsed = create({
      templateID: "base",
      timeout: null,
      autoResume: { enabled: null },
      network: { allowOut: null, maskRequestHost: null, egressProxy: null },
      mcp: null,
    });
    expect(parsed).toMatchObject({ timeoutSeconds: 300, autoResume: false, mcpServers: null, network: {} });
    expect(refusal(() => create({ templateID: "base", metadata: { a: null } }))).toBe(
      "metadata.a must be a string, got null",
    );
    expect(refusal(() => parseNetworkUpdate({ allowOut: ["1.1.1.1", null] }))).toBe(
      "allowOut[1] must be a string, got null",
    );
    expect(parseConnectBody(null, 2)).toEqual({ timeoutSeconds: 300, memory: undefined });
  });

  it("keeps `__proto__` an ordinary key: it sets no field of the parsed body", () => {
    const parsed = parseRequestBody(
      "/sandboxes/{sandboxID}/pause",
      "post",
      JSON.parse('{"memory": null, "__proto__": {"memory": "no"}}'),
    );
    expect(parsed.memory).toBeUndefined();
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype);
  });
});
