import type { MessageInitShape } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import type { ProcessEventSchema } from "@warren/proto/process/process_pb";
import type { ProcessExit } from "./exit-status.js";
import type { OutputChunk } from "./output-buffer.js";
import type { Subscription } from "./subscription.js";

export type ProcessEventInit = MessageInitShape<typeof ProcessEventSchema>;

/** E2B's default when a client sends no (or an unusable) Keepalive-Ping-Interval. */
const DEFAULT_KEEPALIVE_SECONDS = 90;

/** The keepalive interval a stream asked for in seconds, as milliseconds. */
export function keepaliveIntervalMs(header: string | null): number {
  const seconds = header === null ? Number.NaN : Number(header.trim());
  const valid = Number.isInteger(seconds) && seconds > 0 && seconds <= 86_400;
  return (valid ? seconds : DEFAULT_KEEPALIVE_SECONDS) * 1000;
}

export function startEvent(pid: number): ProcessEventInit {
  return { event: { case: "start", value: { pid } } };
}

function dataEvent(chunk: OutputChunk): ProcessEventInit {
  return { event: { case: "data", value: { output: { case: chunk.stream, value: chunk.data } } } };
}

function endEvent(exit: ProcessExit): ProcessEventInit {
  return { event: { case: "end", value: { ...exit } } };
}

const KEEPALIVE: ProcessEventInit = { event: { case: "keepalive", value: {} } };

/**
 * The events of one subscription until the process ends: output, then the end event, with a
 * keepalive after every `keepaliveMs` without a message. The stream stops early when `signal`
 * aborts: a deadline ends it with deadline_exceeded, a client that went away ends it quietly.
 * Either way the process itself is untouched, and the subscription is closed.
 */
export async function* processEvents(
  subscription: Subscription,
  keepaliveMs: number,
  signal: AbortSignal,
): AsyncGenerator<ProcessEventInit> {
  try {
    for (;;) {
      if (signal.aborted) {
        if (signal.reason instanceof ConnectError) throw signal.reason;
        return;
      }
      const item = subscription.take();
      if (item?.kind === "data") {
        yield dataEvent(item.chunk);
      } else if (item?.kind === "end") {
        yield endEvent(item.exit);
        return;
      } else if (item?.kind === "failed") {
        throw item.error;
      } else if ((await nextWake(subscription, keepaliveMs, signal)) === "keepalive") {
        yield KEEPALIVE;
      }
    }
  } finally {
    subscription.close();
  }
}

type Wake = "item" | "keepalive" | "aborted";

function nextWake(subscription: Subscription, keepaliveMs: number, signal: AbortSignal): Promise<Wake> {
  return new Promise<Wake>((resolve) => {
    const finish = (wake: Wake) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      resolve(wake);
    };
    const onAbort = () => finish("aborted");
    const timer = setTimeout(() => finish("keepalive"), keepaliveMs);
    signal.addEventListener("abort", onAbort, { once: true });
    void subscription.whenReady().then(() => finish("item"));
  });
}
