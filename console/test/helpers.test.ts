import { describe, expect, it } from "vitest";
import { sandboxPortUrl } from "../src/envd.js";
import { joinPath, matchesSearch, parentPath, shortDuration } from "../src/format.js";
import { match } from "../src/router.js";
import { authHeaders, clearCredential, loadCredential, saveCredential } from "../src/session.js";

function memoryStorage(): Storage {
  const data = new Map<string, string>();
  return {
    get length() {
      return data.size;
    },
    clear: () => data.clear(),
    getItem: (k) => data.get(k) ?? null,
    key: (i) => [...data.keys()][i] ?? null,
    removeItem: (k) => void data.delete(k),
    setItem: (k, v) => void data.set(k, v),
  };
}

describe("console helpers", () => {
  it("routes /sandboxes/:id/:tab with the tab optional and nothing extra", () => {
    expect(match("/sandboxes/:id/:tab?", "/sandboxes/abc")).toEqual({ id: "abc" });
    expect(match("/sandboxes/:id/:tab?", "/sandboxes/abc/files")).toEqual({ id: "abc", tab: "files" });
    expect(match("/sandboxes/:id/:tab?", "/sandboxes/abc/files/extra")).toBeUndefined();
    expect(match("/sandboxes", "/templates")).toBeUndefined();
  });

  it("fills the sandbox URL template for a port", () => {
    expect(sandboxPortUrl("http://{port}-{sandboxID}.localhost:8080/", "abc1", 49983)).toBe(
      "http://49983-abc1.localhost:8080",
    );
  });

  it("searches id, template, node and metadata, every term must match", () => {
    const s = { sandboxID: "i1abc", templateID: "base", metadata: { owner: "ann", env: "prod" } };
    expect(matchesSearch(s, "")).toBe(true);
    expect(matchesSearch(s, "owner=ann")).toBe(true);
    expect(matchesSearch(s, "base prod")).toBe(true);
    expect(matchesSearch(s, "base staging")).toBe(false);
    expect(matchesSearch({ ...s, nodeID: "node-b1" }, "node-b1 ann")).toBe(true);
    expect(matchesSearch({ ...s, nodeID: null }, "node-b1")).toBe(false);
  });

  it("formats durations and walks POSIX paths", () => {
    expect(shortDuration(59_000)).toBe("59s");
    expect(shortDuration(3_725_000)).toBe("1h 2m");
    expect(shortDuration(-5)).toBe("0s");
    expect(joinPath("/", "a")).toBe("/a");
    expect(joinPath("/home/user", "a")).toBe("/home/user/a");
    expect(parentPath("/home/user/")).toBe("/home");
    expect(parentPath("/home")).toBe("/");
  });

  it("keeps the credential in the given session storage and sends it only as a header", () => {
    const storage = memoryStorage();
    expect(loadCredential(storage)).toBeUndefined();
    saveCredential({ kind: "apiKey", secret: "e2b_x" }, storage);
    expect(loadCredential(storage)).toEqual({ kind: "apiKey", secret: "e2b_x" });
    expect(authHeaders({ kind: "apiKey", secret: "e2b_x" })).toEqual({ "X-API-Key": "e2b_x" });
    expect(authHeaders({ kind: "admin", secret: "t" })).toEqual({ "X-Admin-Token": "t" });
    storage.setItem("warren.console.credential", "{not json");
    expect(loadCredential(storage)).toBeUndefined();
    clearCredential(storage);
    expect(storage.length).toBe(0);
  });
});
