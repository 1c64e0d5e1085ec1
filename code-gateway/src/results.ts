import type { Content, JupyterMessage } from "./jupyter/wire.js";

/** One line of the /execute NDJSON stream (E2B's wire names). */
export type OutputLine = Record<string, unknown> & { type: string };

/** Jupyter MIME type → E2B result field; anything else goes to `extra`. */
const MIME_FIELDS: Readonly<Record<string, string>> = {
  "text/plain": "text",
  "text/html": "html",
  "text/markdown": "markdown",
  "image/svg+xml": "svg",
  "image/png": "png",
  "image/jpeg": "jpeg",
  "application/pdf": "pdf",
  "text/latex": "latex",
  "application/json": "json",
  "application/javascript": "javascript",
  "e2b/data": "data",
  "e2b/chart": "chart",
};

/** E2B strips one pair of surrounding quotes from text/plain ('/home/user' → /home/user). */
export function stripQuotes(text: string): string {
  if (text.length >= 2) {
    const first = text[0];
    if ((first === "'" || first === '"') && text.endsWith(first)) return text.slice(1, -1);
  }
  return text;
}

export function resultLine(bundle: Content, isMainResult: boolean): OutputLine {
  const line: OutputLine = { type: "result", is_main_result: isMainResult };
  const extra: Record<string, unknown> = {};
  for (const [mime, value] of Object.entries(bundle)) {
    const field = MIME_FIELDS[mime];
    if (field === "text" && typeof value === "string") line.text = stripQuotes(value);
    else if (field) line[field] = value;
    else extra[mime] = value;
  }
  line.extra = extra;
  return line;
}

/** Maps one iopub message of an execution to its stream line, or undefined for messages E2B does not forward. */
export function outputLine(message: JupyterMessage): OutputLine | undefined {
  const content = message.content;
  switch (message.header.msg_type) {
    case "execute_input":
      return { type: "number_of_executions", execution_count: content.execution_count };
    case "stream":
      return {
        type: content.name === "stderr" ? "stderr" : "stdout",
        text: String(content.text ?? ""),
        timestamp: new Date().toISOString(),
      };
    case "execute_result":
      return resultLine((content.data ?? {}) as Content, true);
    case "display_data":
    case "update_display_data":
      return resultLine((content.data ?? {}) as Content, false);
    case "error":
      return errorLine(
        String(content.ename ?? "Error"),
        String(content.evalue ?? ""),
        Array.isArray(content.traceback) ? content.traceback.map(String).join("\n") : "",
      );
    default:
      return undefined;
  }
}

export function errorLine(name: string, value: string, traceback = ""): OutputLine {
  return { type: "error", name, value, traceback };
}
