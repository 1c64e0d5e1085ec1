import { describe, expect, it } from "vitest";
import { normalizeLanguage, setEnvCode, unsetEnvCode, unsupportedLanguageMessage } from "./languages.js";

describe("languages", () => {
  it("normalises r and java as E2B does (case and spaces ignored)", () => {
    expect(normalizeLanguage(" R ")).toBe("r");
    expect(normalizeLanguage("Java")).toBe("java");
    expect(normalizeLanguage("cobol")).toBeUndefined();
  });

  it("sets and unsets env vars in R with string literals that keep quotes and backslashes", () => {
    expect(setEnvCode("r", { A: 'say "hi" \\ now', _B: "x" })).toBe(
      'Sys.setenv("A" = "say \\"hi\\" \\\\ now", "_B" = "x")\n',
    );
    expect(unsetEnvCode("r", ["A", "_B"])).toBe('Sys.unsetenv(c("A","_B"))\n');
  });

  it("hands Java's env changes to jshell_kernel.py as one directive line each", () => {
    expect(setEnvCode("java", { A: "1" })).toBe('%warren_env {"set":{"A":"1"}}\n');
    expect(unsetEnvCode("java", ["A"])).toBe('%warren_env {"unset":["A"]}\n');
  });

  it("words an unsupported language the way E2B's gateway does (Python json.dumps of Jupyter's 501 body)", () => {
    expect(unsupportedLanguageMessage(" Kotlin ")).toBe(
      'Failed to create context: {"message": "The \'kotlin\' kernel is not available. Please pick another suitable ' +
        'kernel instead, or install that kernel.", "short_message": "kotlin not found"}',
    );
    expect(unsupportedLanguageMessage("é")).toContain('"short_message": "\\u00e9 not found"');
  });
});
