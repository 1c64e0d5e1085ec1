import { describe, expect, it } from "vitest";
import type { JupyterMessage } from "./jupyter/wire.js";
import { outputLine, resultLine, stripQuotes } from "./results.js";

const message = (msgType: string, content: Record<string, unknown>): JupyterMessage => ({
  identities: [],
  header: { msg_id: "m", session: "s", username: "u", date: "", msg_type: msgType, version: "5.3" },
  parentHeader: {},
  metadata: {},
  content,
  buffers: [],
});

describe("results", () => {
  it("strips one pair of surrounding quotes from text/plain, as E2B does", () => {
    expect(stripQuotes("'/home/user'")).toBe("/home/user");
    expect(stripQuotes('"a"')).toBe("a");
    expect(stripQuotes("''x''")).toBe("'x'");
    expect(stripQuotes("'a\"")).toBe("'a\"");
    expect(stripQuotes("'")).toBe("'");
  });

  it("maps every MIME type to its E2B field and the rest to extra", () => {
    const line = resultLine(
      {
        "text/plain": "'t'",
        "text/html": "<b>",
        "text/markdown": "*m*",
        "image/svg+xml": "<svg/>",
        "image/png": "iVBOR",
        "image/jpeg": "/9j/",
        "application/pdf": "JVBER",
        "text/latex": "$x$",
        "application/json": { a: 1 },
        "application/javascript": "alert(1)",
        "e2b/data": { c: [1] },
        "e2b/chart": { type: "line" },
        "application/vnd.custom": "z",
      },
      true,
    );
    expect(line).toEqual({
      type: "result",
      is_main_result: true,
      text: "t",
      html: "<b>",
      markdown: "*m*",
      svg: "<svg/>",
      png: "iVBOR",
      jpeg: "/9j/",
      pdf: "JVBER",
      latex: "$x$",
      json: { a: 1 },
      javascript: "alert(1)",
      data: { c: [1] },
      chart: { type: "line" },
      extra: { "application/vnd.custom": "z" },
    });
  });

  it("turns iopub messages into stream lines and ignores the rest", () => {
    expect(outputLine(message("execute_input", { execution_count: 3 }))).toEqual({
      type: "number_of_executions",
      execution_count: 3,
    });
    expect(outputLine(message("stream", { name: "stderr", text: "e\n" }))).toMatchObject({
      type: "stderr",
      text: "e\n",
    });
    expect(outputLine(message("display_data", { data: { "text/plain": "x" } }))).toMatchObject({
      type: "result",
      is_main_result: false,
      text: "x",
    });
    expect(outputLine(message("error", { ename: "E", evalue: "v", traceback: ["a", "b"] }))).toEqual({
      type: "error",
      name: "E",
      value: "v",
      traceback: "a\nb",
    });
    expect(outputLine(message("clear_output", {}))).toBeUndefined();
  });
});
