import { useEffect, useRef, useState } from "preact/hooks";
import type { ExecApproval, LedgerEvent, WarrenApi } from "./api.js";
import { type LiveStatus, ledgerTail } from "./live-sandboxes.js";
import { followEvents } from "./sse.js";

/** The ledger events that change an approval (or open one). */
export const isExecEvent = (type: string): boolean => type.startsWith("exec.");

// Enough for a page: a team with more waiting reviews than this has a bigger problem than this page.
const PENDING_LIMIT = 500;
const RECENT_LIMIT = 100;

export interface LiveApprovals {
  readonly pending: ExecApproval[];
  readonly recent: ExecApproval[];
}

export interface LiveApprovalsState {
  readonly lists: LiveApprovals | undefined;
  readonly error: unknown;
  readonly status: LiveStatus;
  /** Re-reads the lists now (after this page decided one: not waiting for the event). */
  readonly refresh: () => void;
  /** Starts over: the tail, the lists and a new stream. */
  readonly reload: () => void;
}

/**
 * The team's pending and recent approvals, read again on every `exec.*` event of its ledger stream (SSE; no
 * polling). The one timer is the next pending review's deadline, when it turns expired without an event.
 * Nothing is read for the admin token (it has no team).
 */
export function useLiveApprovals(api: WarrenApi | undefined): LiveApprovalsState {
  const [lists, setLists] = useState<LiveApprovals>();
  const [error, setError] = useState<unknown>();
  const [status, setStatus] = useState<LiveStatus>("connecting");
  const [generation, setGeneration] = useState(0);
  const refresh = useRef<(() => void) | undefined>(undefined);

  useEffect(() => {
    setLists(undefined);
    if (!api || api.credential.kind !== "apiKey") return;
    let stopped = false;
    let follow: { stop: () => void } | undefined;
    let deadline: ReturnType<typeof setTimeout> | undefined;
    let reading = false;
    let again = false;
    // One read at a time; events that arrive during it cause exactly one more.
    const read = async () => {
      if (reading) {
        again = true;
        return;
      }
      reading = true;
      try {
        do {
          again = false;
          const [pending, recent] = await Promise.all([
            api.approvals({ state: "pending", limit: PENDING_LIMIT }),
            api.approvals({ limit: RECENT_LIMIT }),
          ]);
          if (stopped) return;
          setError(undefined);
          setLists({ pending, recent });
          clearTimeout(deadline);
          const next = Math.min(...pending.map((a) => Date.parse(a.expiresAt)));
          if (Number.isFinite(next)) deadline = setTimeout(() => void read(), Math.max(0, next - Date.now()) + 1000);
        } while (again && !stopped);
      } catch (e) {
        if (!stopped) setError(e);
      } finally {
        reading = false;
      }
    };
    refresh.current = () => void read();
    (async () => {
      try {
        // The tail first: a review opened between it and the first read is read again, never missed.
        const tail = await ledgerTail(api);
        await read();
        if (stopped) return;
        follow = followEvents({
          credential: api.credential,
          path: "/warren/v1/events/stream",
          cursor: tail,
          onStatus: (s) => setStatus(s),
          onEvent: (event) => {
            if (isExecEvent((JSON.parse(event.data) as LedgerEvent).type)) void read();
          },
        });
      } catch (e) {
        if (!stopped) setError(e);
      }
    })();
    return () => {
      stopped = true;
      refresh.current = undefined;
      clearTimeout(deadline);
      follow?.stop();
    };
  }, [api, generation]);

  return {
    lists,
    error,
    status,
    refresh: () => refresh.current?.(),
    reload: () => setGeneration((g) => g + 1),
  };
}
