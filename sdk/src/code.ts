import { CODE_GATEWAY_PORT, type ConnectionConfig } from "./config.js";
import { InvalidArgumentError, NotFoundError, SandboxError, TimeoutError } from "./errors.js";

export type RunCodeLanguage = "python" | "javascript" | "typescript" | "r" | "java" | "bash" | (string & {});

export interface Context {
  id: string;
  language: string;
  cwd: string;
}

export interface OutputMessage {
  line: string;
  /** Microseconds since the epoch, as E2B reports it. */
  timestamp: number;
  error: boolean;
}

export class ExecutionError {
  constructor(
    public name: string,
    public value: string,
    public traceback: string,
  ) {}
}

const KNOWN_RESULT_KEYS = new Set([
  "plain",
  "html",
  "markdown",
  "svg",
  "png",
  "jpeg",
  "pdf",
  "latex",
  "json",
  "javascript",
  "data",
  "chart",
  "extra",
  "text",
]);

/** One rich output of an execution (E2B's Result): the main result or a display. */
export class Result {
  readonly text?: string;
  readonly html?: string;
  readonly markdown?: string;
  readonly svg?: string;
  readonly png?: string;
  readonly jpeg?: string;
  readonly pdf?: string;
  readonly latex?: string;
  readonly json?: string;
  readonly javascript?: string;
  readonly data?: Record<string, unknown>;
  readonly chart?: Record<string, unknown>;
  readonly extra: Record<string, unknown> = {};
  readonly raw: Record<string, unknown>;

  constructor(
    raw: Record<string, unknown>,
    readonly isMainResult: boolean,
  ) {
    const data = { ...raw };
    delete data.type;
    delete data.is_main_result;
    this.raw = data;
    const pick = (key: string) => data[key] as string | undefined;
    this.text = pick("text");
    this.html = pick("html");
    this.markdown = pick("markdown");
    this.svg = pick("svg");
    this.png = pick("png");
    this.jpeg = pick("jpeg");
    this.pdf = pick("pdf");
    this.latex = pick("latex");
    this.json = pick("json");
    this.javascript = pick("javascript");
    this.data = data.data as Record<string, unknown> | undefined;
    this.chart = data.chart as Record<string, unknown> | undefined;
    for (const key of Object.keys(data)) if (!KNOWN_RESULT_KEYS.has(key)) this.extra[key] = data[key];
  }

  formats(): string[] {
    const formats = ["html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data"].filter(
      (key) => this[key as keyof Result] !== undefined,
    );
    return [...formats, ...Object.keys(this.extra)];
  }
}

export interface Logs {
  stdout: string[];
  stderr: string[];
}

export class Execution {
  constructor(
    public results: Result[] = [],
    public logs: Logs = { stdout: [], stderr: [] },
    public error?: ExecutionError,
    public executionCount?: number,
  ) {}

  /** Text of the main result, if there is one. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }
}

export interface RunCodeOpts {
  language?: RunCodeLanguage;
  context?: Context;
  onStdout?: (output: OutputMessage) => unknown;
  onStderr?: (output: OutputMessage) => unknown;
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
  envs?: Record<string, string>;
  /** Execution time limit in ms; Warren's default is none (0). */
  timeoutMs?: number;
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface CreateCodeContextOpts {
  cwd?: string;
  language?: RunCodeLanguage;
  requestTimeoutMs?: number;
}

/** The code gateway (port 49999): runCode over Jupyter kernels and the contexts that hold their state. */
export class CodeInterpreter {
  private readonly url: string;

  /** @internal */
  constructor(
    private readonly config: ConnectionConfig,
    private readonly sandboxId: string,
    sandboxDomain: string | undefined,
    private readonly accessToken: string | undefined,
    private readonly trafficAccessToken: string | undefined,
  ) {
    this.url = config.sandboxPortUrl(sandboxId, CODE_GATEWAY_PORT, sandboxDomain);
  }

  private headers(withToken: boolean): Record<string, string> {
    const headers: Record<string, string> = {
      "Content-Type": "application/json",
      ...this.config.routingHeaders(this.sandboxId, CODE_GATEWAY_PORT),
    };
    if (withToken && this.accessToken) headers["X-Access-Token"] = this.accessToken;
    if (this.trafficAccessToken) headers["E2B-Traffic-Access-Token"] = this.trafficAccessToken;
    return headers;
  }

  async runCode(code: string, opts: RunCodeOpts = {}): Promise<Execution> {
    if (opts.context && opts.language) {
      throw new InvalidArgumentError("You can provide context or language, but not both at the same time.");
    }
    const body: Record<string, unknown> = { code };
    if (opts.context) body.context_id = opts.context.id;
    if (opts.language) body.language = opts.language;
    if (opts.envs) body.env_vars = opts.envs;
    const controller = new AbortController();
    const signals = [controller.signal, ...(opts.signal ? [opts.signal] : [])];
    const requestTimeout = opts.requestTimeoutMs ?? this.config.requestTimeoutMs;
    const headerTimer = requestTimeout > 0 ? setTimeout(() => controller.abort("request"), requestTimeout) : undefined;
    let execTimer: NodeJS.Timeout | undefined;
    const execution = new Execution();
    try {
      const res = await fetch(`${this.url}/execute`, {
        method: "POST",
        headers: this.headers(true),
        body: JSON.stringify(body),
        signal: AbortSignal.any(signals),
      });
      clearTimeout(headerTimer);
      if (!res.ok) throw await gatewayError(res);
      if (!res.body) throw new SandboxError("Not response body");
      const timeoutMs = opts.timeoutMs ?? 0;
      if (timeoutMs > 0) execTimer = setTimeout(() => controller.abort("execution"), timeoutMs);
      for await (const line of lines(res.body)) {
        if (line.trim() !== "") await applyLine(execution, line, opts);
      }
      return execution;
    } catch (error) {
      if (controller.signal.aborted && controller.signal.reason === "execution") {
        throw new TimeoutError("Execution timed out — the 'timeoutMs' option can be used to increase this timeout");
      }
      if (controller.signal.aborted && controller.signal.reason === "request") {
        throw new TimeoutError(
          "Request timed out — the 'requestTimeoutMs' option can be used to increase this timeout",
        );
      }
      throw error;
    } finally {
      clearTimeout(headerTimer);
      clearTimeout(execTimer);
    }
  }

  async createCodeContext(opts: CreateCodeContextOpts = {}): Promise<Context> {
    const body: Record<string, unknown> = {};
    if (opts.language !== undefined) body.language = opts.language;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    const res = await this.contexts("POST", "/contexts", opts.requestTimeoutMs, body);
    return (await res.json()) as Context;
  }

  async listCodeContexts(): Promise<Context[]> {
    const res = await this.contexts("GET", "/contexts");
    return (await res.json()) as Context[];
  }

  async removeCodeContext(context: Context | string): Promise<void> {
    const id = typeof context === "string" ? context : context.id;
    await this.contexts("DELETE", `/contexts/${encodeURIComponent(id)}`);
  }

  async restartCodeContext(context: Context | string): Promise<void> {
    const id = typeof context === "string" ? context : context.id;
    await this.contexts("POST", `/contexts/${encodeURIComponent(id)}/restart`);
  }

  private async contexts(method: string, path: string, requestTimeoutMs?: number, body?: unknown): Promise<Response> {
    const res = await fetch(`${this.url}${path}`, {
      method,
      headers: this.headers(false),
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      signal: this.config.signal(requestTimeoutMs),
    });
    if (!res.ok) throw await gatewayError(res);
    return res;
  }
}

async function gatewayError(res: Response): Promise<Error> {
  const body = await res.text();
  if (res.status === 502) {
    return new TimeoutError(`${body}: This error is likely due to sandbox timeout.`, { statusCode: 502 });
  }
  if (res.status === 404) return new NotFoundError(body, { statusCode: 404 });
  if (res.status === 400) return new InvalidArgumentError(body, { statusCode: 400 });
  return new SandboxError(`${res.status} ${res.statusText}${body ? `: ${body}` : ""}`, { statusCode: res.status });
}

async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let newline = buffer.indexOf("\n");
    while (newline !== -1) {
      yield buffer.slice(0, newline);
      buffer = buffer.slice(newline + 1);
      newline = buffer.indexOf("\n");
    }
  }
  buffer += decoder.decode();
  if (buffer.length > 0) yield buffer;
}

async function applyLine(execution: Execution, line: string, opts: RunCodeOpts): Promise<void> {
  const msg = JSON.parse(line) as Record<string, unknown>;
  switch (msg.type) {
    case "result": {
      const result = new Result(msg, msg.is_main_result === true);
      execution.results.push(result);
      await opts.onResult?.(result);
      break;
    }
    case "stdout":
      execution.logs.stdout.push(String(msg.text));
      await opts.onStdout?.({ line: String(msg.text), timestamp: Date.now() * 1000, error: false });
      break;
    case "stderr":
      execution.logs.stderr.push(String(msg.text));
      await opts.onStderr?.({ line: String(msg.text), timestamp: Date.now() * 1000, error: true });
      break;
    case "error":
      execution.error = new ExecutionError(String(msg.name), String(msg.value), String(msg.traceback));
      await opts.onError?.(execution.error);
      break;
    case "number_of_executions":
      execution.executionCount = Number(msg.execution_count);
      break;
  }
}
