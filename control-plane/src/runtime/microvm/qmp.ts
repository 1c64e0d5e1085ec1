import { connect, type Socket } from "node:net";

/**
 * A minimal QMP client (QEMU Machine Protocol: line-delimited JSON over a unix socket). One command at a time:
 * the driver serialises operations per VM anyway, and QMP answers in order. Events are ignored.
 */
export class QmpClient {
  private buffer = "";
  private waiter: { resolve: (value: unknown) => void; reject: (error: Error) => void } | undefined;
  private greeted: Promise<void>;
  private closedError: Error | undefined;

  private constructor(
    private readonly socket: Socket,
    /** The socket's path (QEMU's directory: see qemu.ts saveMemory). */
    readonly path: string,
  ) {
    let greet: () => void = () => undefined;
    this.greeted = new Promise((resolve) => {
      greet = resolve;
    });
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      this.buffer += chunk;
      let nl = this.buffer.indexOf("\n");
      while (nl >= 0) {
        const line = this.buffer.slice(0, nl).trim();
        this.buffer = this.buffer.slice(nl + 1);
        nl = this.buffer.indexOf("\n");
        if (!line) continue;
        let message: Record<string, unknown>;
        try {
          message = JSON.parse(line) as Record<string, unknown>;
        } catch {
          continue;
        }
        if ("QMP" in message) greet();
        else if ("return" in message) this.settle(undefined, message.return);
        else if ("error" in message) {
          const error = message.error as { class?: string; desc?: string };
          this.settle(new Error(`QMP error ${error.class ?? ""}: ${error.desc ?? JSON.stringify(error)}`));
        }
      }
    });
    const fail = (error: Error) => {
      this.closedError = error;
      this.settle(error);
    };
    socket.on("error", fail);
    socket.on("close", () => fail(new Error("QMP connection closed")));
  }

  private settle(error: Error | undefined, value?: unknown): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    if (!waiter) return;
    if (error) waiter.reject(error);
    else waiter.resolve(value);
  }

  /** Connects, waits for the greeting and negotiates capabilities; rejects after `timeoutMs`. */
  static async open(path: string, timeoutMs = 10_000): Promise<QmpClient> {
    const socket = connect(path);
    const client = new QmpClient(socket, path);
    await withTimeout(
      new Promise<void>((resolve, reject) => {
        socket.once("error", reject);
        client.greeted.then(resolve, reject);
      }),
      timeoutMs,
      `QMP greeting on ${path}`,
    );
    await client.execute("qmp_capabilities", undefined, timeoutMs);
    return client;
  }

  async execute<T = unknown>(command: string, args?: Record<string, unknown>, timeoutMs = 10_000): Promise<T> {
    if (this.closedError) throw this.closedError;
    if (this.waiter) throw new Error(`QMP command '${command}' sent while another is pending`);
    const answer = new Promise<unknown>((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
    this.socket.write(`${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`);
    try {
      return (await withTimeout(answer, timeoutMs, `QMP '${command}'`)) as T;
    } catch (error) {
      this.waiter = undefined;
      throw error;
    }
  }

  close(): void {
    this.socket.destroy();
  }
}

/** Opens a QMP connection, runs `fn`, closes it. */
export async function withQmp<T>(path: string, fn: (qmp: QmpClient) => Promise<T>, timeoutMs = 10_000): Promise<T> {
  const qmp = await QmpClient.open(path, timeoutMs);
  try {
    return await fn(qmp);
  } finally {
    qmp.close();
  }
}

export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
