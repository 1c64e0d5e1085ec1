import { request } from "node:http";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ENVD_ACCESS_TOKEN_HEADER, ENVD_FILES_PATH, ENVD_FILES_QUERY } from "@warren/proto/envd-http";
import { Process } from "@warren/proto/process/process_pb";
import { AgentError } from "./errors.js";

/** One event of a command run through envd: output as it comes, then the exit. */
export type CommandEvent =
  | { readonly kind: "pid"; readonly pid: number }
  | { readonly kind: "stdout" | "stderr"; readonly data: Uint8Array }
  | { readonly kind: "exit"; readonly exitCode: number; readonly status: string };

export interface CommandSpec {
  readonly command: string;
  /** Empty: root. */
  readonly user: string;
  /** Empty: the user's home (envd's default). */
  readonly cwd: string;
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
}

function basicAuth(user: string): string {
  return `Basic ${Buffer.from(`${user}:`).toString("base64")}`;
}

/**
 * Runs a command in a sandbox through its envd, the way E2B's builder does (`/bin/bash -l -c <command>` as the
 * step's user): the sandbox's own isolation, nothing run on the node. Aborting `signal` ends the stream only;
 * envd leaves the process running (a template's start command goes on into its ready snapshot).
 */
export async function* runInSandbox(
  envdUrl: string,
  accessToken: string,
  spec: CommandSpec,
  signal: AbortSignal,
): AsyncGenerator<CommandEvent> {
  if (spec.command.trim() === "") throw new AgentError("invalid_argument", "command is empty");
  const client = createClient(
    Process,
    createConnectTransport({ baseUrl: envdUrl, httpVersion: "1.1", useBinaryFormat: true }),
  );
  const stream = client.start(
    {
      process: {
        cmd: "/bin/bash",
        args: ["-l", "-c", spec.command],
        envs: { ...spec.env },
        ...(spec.cwd ? { cwd: spec.cwd } : {}),
      },
      stdin: false,
    },
    {
      signal,
      ...(spec.timeoutMs > 0 ? { timeoutMs: spec.timeoutMs } : {}),
      headers: { Authorization: basicAuth(spec.user || "root"), [ENVD_ACCESS_TOKEN_HEADER]: accessToken },
    },
  );
  for await (const message of stream) {
    const event = message.event?.event;
    if (!event) continue;
    if (event.case === "start") yield { kind: "pid", pid: event.value.pid };
    else if (event.case === "data") {
      const output = event.value.output;
      if (output.case === "stdout" || output.case === "stderr") yield { kind: output.case, data: output.value };
    } else if (event.case === "end") {
      yield { kind: "exit", exitCode: event.value.exitCode, status: event.value.error ?? event.value.status };
      return;
    }
  }
  throw new AgentError("internal", "envd ended the command's stream without its exit");
}

/** Writes `data` at `path` in the sandbox through envd's `/files` (as root; envd creates missing parents). */
export function writeInSandbox(envdUrl: string, accessToken: string, path: string, data: Uint8Array): Promise<void> {
  if (!path.startsWith("/"))
    return Promise.reject(new AgentError("invalid_argument", `path '${path}' is not absolute`));
  const url = new URL(ENVD_FILES_PATH, envdUrl);
  url.searchParams.set(ENVD_FILES_QUERY.path, path);
  url.searchParams.set(ENVD_FILES_QUERY.username, "root");
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: "POST",
        agent: false,
        timeout: 120_000,
        headers: {
          "Content-Type": "application/octet-stream",
          "Content-Length": data.byteLength,
          [ENVD_ACCESS_TOKEN_HEADER]: accessToken,
        },
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8").on("data", (chunk: string) => {
          text += chunk;
        });
        res.on("end", () => {
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) resolve();
          else reject(new AgentError("internal", `envd /files answered ${status}: ${text.slice(0, 200)}`));
        });
      },
    );
    req.once("timeout", () => req.destroy(new Error("envd /files timed out")));
    req.once("error", (error) => reject(new AgentError("internal", `writing ${path}: ${error.message}`)));
    req.end(data);
  });
}
