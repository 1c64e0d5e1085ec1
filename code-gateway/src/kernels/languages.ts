import { fileURLToPath } from "node:url";
import type { GatewayConfig } from "../config.js";

/** Languages a context can run, after E2B's normalisation (`js` → javascript, `ts` → typescript). */
export type Language = "python" | "javascript" | "typescript" | "bash" | "r" | "java";

export const LANGUAGES: readonly Language[] = ["python", "javascript", "typescript", "bash", "r", "java"];

const ALIASES: Record<string, Language> = {
  "": "python",
  python: "python",
  python3: "python",
  js: "javascript",
  javascript: "javascript",
  ts: "typescript",
  typescript: "typescript",
  bash: "bash",
  sh: "bash",
  r: "r",
  java: "java",
};

/** E2B's normalize_language; undefined when Warren has no kernel for it. */
export function normalizeLanguage(language: string | undefined | null): Language | undefined {
  return ALIASES[(language ?? "").trim().toLowerCase()];
}

/**
 * The body E2B's gateway answers for a language it has no kernel for: Jupyter's 501 for the missing kernelspec
 * (Python `json.dumps`: `", "` separators, non-ASCII escaped), wrapped in "Failed to create context: ". E2B sends
 * it with status 500; Warren keeps 400 (bad input), with the same text.
 */
export function unsupportedLanguageMessage(language: string): string {
  const kernel = language.trim().toLowerCase();
  const message = `The '${kernel}' kernel is not available. Please pick another suitable kernel instead, or install that kernel.`;
  return `Failed to create context: {"message": ${pythonJsonString(message)}, "short_message": ${pythonJsonString(`${kernel} not found`)}}`;
}

function pythonJsonString(text: string): string {
  return JSON.stringify(text).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

const PYTHON_DIR = fileURLToPath(new URL("../../python/", import.meta.url));
const JS_KERNEL = fileURLToPath(new URL("./js-kernel.js", import.meta.url));
/** IRkernel's own kernelspec command (Debian's r-cran-irkernel). */
const IRKERNEL = ["--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"];

/**
 * ipykernel prints a Ctrl-C notice and connection hints to stdout unless it has a parent
 * handle; 1 (init) silences them without starting its parent poller (our parent-death
 * signal does that job).
 */
const QUIET_IPYKERNEL = "--IPKernelApp.parent_handle=1";
/** Kernel-side warnings (e.g. "debugpy_stream undefined" since the debugger is off) are noise in our logs. */
const IPYKERNEL_ERRORS_ONLY = "--IPKernelApp.log_level=ERROR";

/**
 * Code a new kernel runs silently once it answers (KernelLaunch.warmUpCode), so the first execution a user sends
 * does not also pay the kernel's first (10–30 ms in a Python kernel here); "" for none. Python only: the default
 * context every `runCode` without a language lands in.
 */
export function warmUpCode(language: Language): string {
  return language === "python" ? "None" : "";
}

/** The command line that starts a kernel for `language`; `{connection_file}` is filled in by Kernel.start. */
export function kernelArgv(language: Language, config: GatewayConfig): string[] {
  switch (language) {
    case "python":
      return [
        config.pythonPath,
        "-Xfrozen_modules=off",
        `${PYTHON_DIR}python_kernel.py`,
        "-f",
        "{connection_file}",
        // No sqlite history: many kernels would contend on one file and it slows every cell.
        "--HistoryManager.enabled=False",
        QUIET_IPYKERNEL,
        IPYKERNEL_ERRORS_ONLY,
        `--IPKernelApp.exec_files=${PYTHON_DIR}python_startup.py`,
      ];
    case "bash":
      return [
        config.pythonPath,
        "-Xfrozen_modules=off",
        `${PYTHON_DIR}bash_kernel.py`,
        "-f",
        "{connection_file}",
        QUIET_IPYKERNEL,
        IPYKERNEL_ERRORS_ONLY,
      ];
    case "javascript":
    case "typescript":
      return [config.nodePath, JS_KERNEL, "{connection_file}", language];
    case "r":
      return [config.rPath, ...IRKERNEL];
    case "java":
      return [
        config.pythonPath,
        "-Xfrozen_modules=off",
        `${PYTHON_DIR}jshell_kernel.py`,
        `--java=${config.javaPath}`,
        "-f",
        "{connection_file}",
        QUIET_IPYKERNEL,
        IPYKERNEL_ERRORS_ONLY,
      ];
  }
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function isValidEnvName(name: string): boolean {
  return ENV_NAME.test(name);
}

/** Code that sets `vars` in the kernel's process environment (names already validated). */
export function setEnvCode(language: Language, vars: Readonly<Record<string, string>>): string {
  const entries = Object.entries(vars);
  if (entries.length === 0) return "";
  switch (language) {
    case "python":
      return `import os as __warren_os\n__warren_os.environ.update(${JSON.stringify(vars)})\ndel __warren_os\n`;
    case "javascript":
    case "typescript":
      return `Object.assign(process.env, ${JSON.stringify(vars)});\n`;
    case "bash":
      return entries.map(([k, v]) => `export ${k}=${shellQuote(v)}\n`).join("");
    case "r":
      // R string literals take JSON's escapes; string argument names need no identifier rules.
      return `Sys.setenv(${entries.map(([k, v]) => `${JSON.stringify(k)} = ${JSON.stringify(v)}`).join(", ")})\n`;
    case "java":
      // A JVM cannot change its environment from Java code: jshell_kernel.py takes this directive instead.
      return `${JAVA_ENV_DIRECTIVE}${JSON.stringify({ set: vars })}\n`;
  }
}

/** Code that removes `names` from the kernel's environment. */
export function unsetEnvCode(language: Language, names: readonly string[]): string {
  if (names.length === 0) return "";
  switch (language) {
    case "python":
      return `import os as __warren_os\nfor __warren_k in ${JSON.stringify(names)}:\n    __warren_os.environ.pop(__warren_k, None)\ndel __warren_os, __warren_k\n`;
    case "javascript":
    case "typescript":
      return `for (const k of ${JSON.stringify(names)}) delete process.env[k];\n`;
    case "bash":
      return `unset ${names.join(" ")}\n`;
    case "r":
      return `Sys.unsetenv(${JSON.stringify(names).replace(/^\[/, "c(").replace(/\]$/, ")")})\n`;
    case "java":
      return `${JAVA_ENV_DIRECTIVE}${JSON.stringify({ unset: names })}\n`;
  }
}

/** jshell_kernel.py's env directive (ENV_DIRECTIVE there). */
const JAVA_ENV_DIRECTIVE = "%warren_env ";

function shellQuote(value: string): string {
  return `'${value.replaceAll("'", `'\\''`)}'`;
}
