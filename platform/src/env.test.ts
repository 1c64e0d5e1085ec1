import { describe, expect, it } from "vitest";
import { booleanFromEnv, ConfigError, integerFromEnv, parseList, REDIS_URL, renamedEnv } from "./env.js";

describe("typed env parsing", () => {
  it("reads integers in range, falls back when unset or empty, and names the setting when out of range", () => {
    expect(integerFromEnv({ N: "5" }, "N", 1, 0, 10)).toBe(5);
    expect(integerFromEnv({}, "N", 1, 0, 10)).toBe(1);
    expect(integerFromEnv({ N: "" }, "N", 1, 0, 10)).toBe(1);
    expect(() => integerFromEnv({ N: "11" }, "N", 1, 0, 10)).toThrow(
      new ConfigError("N must be an integer in [0, 10], got '11'"),
    );
    expect(() => integerFromEnv({ N: "1.5" }, "N", 1, 0, 10)).toThrow(ConfigError);
    expect(() => integerFromEnv({ N: " " }, "N", 1, 0, 10)).toThrow(ConfigError);
    expect(() => integerFromEnv({ N: "1e1" }, "N", 1, 0, 10)).toThrow(ConfigError);
    expect(integerFromEnv({ N: "-3" }, "N", 1, -5, 10)).toBe(-3);
  });

  it("reads booleans in the usual spellings and refuses others", () => {
    expect(booleanFromEnv({ B: "Yes" }, "B", false)).toBe(true);
    expect(booleanFromEnv({ B: "0" }, "B", true)).toBe(false);
    expect(booleanFromEnv({}, "B", true)).toBe(true);
    expect(() => booleanFromEnv({ B: "maybe" }, "B", true)).toThrow("B must be true or false, got 'maybe'");
  });

  it("splits lists on commas and drops empty entries", () => {
    expect(parseList(" a, b,,c ")).toEqual(["a", "b", "c"]);
    expect(parseList(undefined)).toEqual([]);
  });

  it("reads a renamed setting under its old name with a warning, and the new name wins", () => {
    const warnings: string[] = [];
    const warn = (message: string) => warnings.push(message);
    expect(renamedEnv({ REDIS_URL: "redis://old" }, REDIS_URL, warn)).toBe("redis://old");
    expect(warnings).toEqual([
      "REDIS_URL is deprecated and will stop working in the next release; set WARREN_REDIS_URL instead",
    ]);
    expect(renamedEnv({ PROXY_REDIS_URL: "redis://old", WARREN_REDIS_URL: "redis://new" }, REDIS_URL, warn)).toBe(
      "redis://new",
    );
    expect(renamedEnv({}, REDIS_URL, warn)).toBeUndefined();
    expect(warnings).toHaveLength(1);
  });
});
