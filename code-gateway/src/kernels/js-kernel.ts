#!/usr/bin/env node
/**
 * Warren's JavaScript/TypeScript Jupyter kernel: `node js-kernel.js <connection file> [javascript|typescript]`.
 *
 * Cells run in this process's global context (as ijavascript does), so declarations persist
 * between cells. A cell's completion value is its result (awaited when it is a promise);
 * a cell with top-level `await` runs inside an async function (see top-level-await.ts).
 * Static `import` declarations become `require` calls, so ESM-style imports work in cells;
 * TypeScript is stripped of types with sucrase first. An interrupt is SIGINT: synchronous
 * code is stopped by vm's breakOnSigint, an awaited promise is abandoned.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { inspect } from "node:util";
import vm from "node:vm";
import { transform } from "sucrase";
import * as zmq from "zeromq";
import {
  type ConnectionInfo,
  type Content,
  endpoint,
  type JupyterMessage,
  type MessageHeader,
  SerialSender,
  WireCodec,
} from "../jupyter/wire.js";
import { rewriteImports } from "./imports.js";
import { wrapTopLevelAwait } from "./top-level-await.js";

const [connectionFile, languageArg] = process.argv.slice(2);
if (!connectionFile) {
  process.stderr.write("usage: js-kernel <connection file> [javascript|typescript]\n");
  process.exit(2);
}
const language = languageArg === "typescript" ? "typescript" : "javascript";
const info = JSON.parse(readFileSync(connectionFile, "utf8")) as ConnectionInfo;
const codec = new WireCodec(info.key, "kernel");

const shell = new zmq.Router();
const control = new zmq.Router();
const stdin = new zmq.Router();
const iopub = new zmq.Publisher();
const heartbeat = new zmq.Reply();
await Promise.all([
  shell.bind(endpoint(info, "shell")),
  control.bind(endpoint(info, "control")),
  stdin.bind(endpoint(info, "stdin")),
  iopub.bind(endpoint(info, "iopub")),
  heartbeat.bind(endpoint(info, "hb")),
]);
const shellOut = new SerialSender(shell);
const controlOut = new SerialSender(control);
const iopubOut = new SerialSender(iopub);

function publish(msgType: string, content: Content, parent: MessageHeader | undefined): Promise<void> {
  const { frames } = codec.encode(msgType, content, { parent, identities: [Buffer.from(`kernel.${msgType}`)] });
  return iopubOut.send(frames).catch(() => undefined);
}

function reply(socket: SerialSender, request: JupyterMessage, msgType: string, content: Content): Promise<void> {
  const { frames } = codec.encode(msgType, content, { parent: request.header, identities: request.identities });
  return socket.send(frames).catch(() => undefined);
}

// Output of user code goes to the cell that produced it (or, for late async output, the last cell).
let outputParent: MessageHeader | undefined;
const writeKernelLog = process.stderr.write.bind(process.stderr);
for (const name of ["stdout", "stderr"] as const) {
  const stream = process[name];
  const original = stream.write.bind(stream);
  stream.write = ((chunk: unknown, encoding?: unknown, callback?: unknown) => {
    const text = typeof chunk === "string" ? chunk : Buffer.from(chunk as Uint8Array).toString("utf8");
    if (outputParent) publish("stream", { name, text }, outputParent);
    else original(text);
    const done = typeof encoding === "function" ? encoding : callback;
    if (typeof done === "function") queueMicrotask(() => (done as () => void)());
    return true;
  }) as typeof stream.write;
}
process.on("uncaughtException", (error) => {
  process.stderr.write(`Uncaught ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
});
process.on("unhandledRejection", (reason) => {
  process.stderr.write(
    `Unhandled promise rejection: ${reason instanceof Error ? (reason.stack ?? reason.message) : String(reason)}\n`,
  );
});

// What cells see besides Node's globals: require resolving from the kernel's cwd.
const globals = globalThis as Record<string, unknown>;
globals.require = createRequire(join(process.cwd(), "__warren_cell.js"));
globals.__warrenDefault = (mod: unknown) =>
  mod && typeof mod === "object" && (mod as { __esModule?: boolean }).__esModule
    ? (mod as { default: unknown }).default
    : mod;

let interruptAwait: (() => void) | undefined;
process.on("SIGINT", () => interruptAwait?.());

class InterruptedError extends Error {
  constructor() {
    super("Execution interrupted");
    this.name = "KeyboardInterrupt";
  }
}

function prepare(code: string): string {
  const javascript =
    language === "typescript"
      ? transform(code, { transforms: ["typescript"], disableESTransforms: true, keepUnusedImports: true }).code
      : code;
  return rewriteImports(javascript);
}

let executionCount = 0;

function compile(source: string): vm.Script {
  const options = {
    filename: `cell[${executionCount}]`,
    importModuleDynamically: vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  };
  try {
    return new vm.Script(source, options);
  } catch (error) {
    // A classic script cannot use top-level await; retry with the body in an async function.
    const wrapped = error instanceof SyntaxError && /\bawait\b/.test(source) ? wrapTopLevelAwait(source) : undefined;
    if (!wrapped) throw error;
    return new vm.Script(wrapped, options);
  }
}

async function runCell(code: string): Promise<unknown> {
  const script = compile(prepare(code));
  const value: unknown = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
  if (!value || typeof (value as { then?: unknown }).then !== "function") return value;
  return await new Promise((resolve, reject) => {
    interruptAwait = () => reject(new InterruptedError());
    (value as Promise<unknown>).then(resolve, reject);
  }).finally(() => {
    interruptAwait = undefined;
  });
}

async function execute(request: JupyterMessage): Promise<void> {
  const code = typeof request.content.code === "string" ? request.content.code : "";
  const silent = request.content.silent === true;
  if (!silent) {
    executionCount += 1;
    // Sent before the cell runs: a synchronous cell blocks the event loop, and the gateway
    // waits for execute_input before it interrupts.
    await publish("execute_input", { code, execution_count: executionCount }, request.header);
  }
  outputParent = silent ? undefined : request.header;
  try {
    const value = await runCell(code);
    if (!silent && value !== undefined) {
      publish(
        "execute_result",
        { execution_count: executionCount, data: { "text/plain": inspect(value, { depth: 4 }) }, metadata: {} },
        request.header,
      );
    }
    await reply(shellOut, request, "execute_reply", {
      status: "ok",
      execution_count: executionCount,
      payload: [],
      user_expressions: {},
    });
  } catch (thrown) {
    const error = thrown instanceof Error ? thrown : new Error(String(thrown));
    const content = {
      ename: error.name,
      evalue: error.message,
      traceback: [error.stack ?? `${error.name}: ${error.message}`],
    };
    if (!silent) publish("error", content, request.header);
    await reply(shellOut, request, "execute_reply", { status: "error", execution_count: executionCount, ...content });
  }
}

const kernelInfo = {
  status: "ok",
  protocol_version: "5.3",
  implementation: "warren-js",
  implementation_version: "0.1.0",
  language_info: {
    name: language,
    version: process.versions.node,
    mimetype: language === "typescript" ? "text/typescript" : "text/javascript",
    file_extension: language === "typescript" ? ".ts" : ".js",
  },
  banner: `Warren ${language} kernel (Node ${process.versions.node})`,
  help_links: [],
};

async function handleShell(request: JupyterMessage): Promise<void> {
  publish("status", { execution_state: "busy" }, request.header);
  switch (request.header.msg_type) {
    case "execute_request":
      await execute(request);
      break;
    case "kernel_info_request":
      await reply(shellOut, request, "kernel_info_reply", kernelInfo);
      break;
    default:
      await reply(shellOut, request, request.header.msg_type.replace(/_request$/, "_reply"), {
        status: "error",
        ename: "NotImplemented",
        evalue: `${request.header.msg_type} is not supported`,
        traceback: [],
      });
  }
  publish("status", { execution_state: "idle" }, request.header);
}

async function serveShell(): Promise<void> {
  for await (const frames of shell) {
    let request: JupyterMessage;
    try {
      request = codec.decode(frames);
    } catch (error) {
      writeKernelLog(`dropped shell message: ${String(error)}\n`);
      continue;
    }
    await handleShell(request);
  }
}

async function serveControl(): Promise<void> {
  for await (const frames of control) {
    let request: JupyterMessage;
    try {
      request = codec.decode(frames);
    } catch (error) {
      writeKernelLog(`dropped control message: ${String(error)}\n`);
      continue;
    }
    switch (request.header.msg_type) {
      case "shutdown_request":
        await reply(controlOut, request, "shutdown_reply", { status: "ok", restart: false });
        process.exit(0);
        break;
      case "interrupt_request":
        interruptAwait?.();
        await reply(controlOut, request, "interrupt_reply", { status: "ok" });
        break;
      case "kernel_info_request":
        await reply(controlOut, request, "kernel_info_reply", kernelInfo);
        break;
    }
  }
}

async function serveHeartbeat(): Promise<void> {
  for await (const frames of heartbeat) await heartbeat.send(frames);
}

void serveControl();
void serveHeartbeat();
void (async () => {
  for await (const _ of stdin) {
    // allow_stdin is always false: nothing to answer
  }
})();
await serveShell();
