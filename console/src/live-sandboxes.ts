import { useEffect, useState } from "preact/hooks";
import { ApiError, type LedgerEvent, type ListedSandbox, type WarrenApi } from "./api.js";
import { followEvents } from "./sse.js";

/** Ledger states after which a sandbox is gone from the list. */
const GONE = new Set(["killed", "failed"]);

/**
 * The ledger's newest id for the team: the list is read after it, and the stream resumes from it, so an event
 * between the two is applied (again), never missed.
 */
export async function ledgerTail(api: WarrenApi, sandboxId?: string): Promise<string> {
  let cursor = "0";
  for (;;) {
    const page = await api.events(sandboxId, cursor, 1000);
    cursor = page.cursor;
    if (page.events.length < 1000) return cursor;
  }
}

export type LiveStatus = "connecting" | "live" | "reconnecting";

export interface LiveList {
  readonly sandboxes: ListedSandbox[] | undefined;
  readonly error: unknown;
  readonly status: LiveStatus;
  readonly reload: () => void;
}

/** The team's running and paused sandboxes, kept current by the ledger's SSE stream (no polling). */
export function useLiveSandboxes(api: WarrenApi): LiveList {
  const [sandboxes, setSandboxes] = useState<ListedSandbox[]>();
  const [error, setError] = useState<unknown>();
  const [status, setStatus] = useState<LiveStatus>("connecting");
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    let stopped = false;
    let follow: { stop: () => void } | undefined;
    const chains = new Map<string, Promise<void>>();
    const refresh = async (id: string, gone: boolean) => {
      let fresh: ListedSandbox | undefined;
      if (!gone) {
        try {
          fresh = await api.getSandbox(id);
        } catch (e) {
          if (!(e instanceof ApiError && e.status === 404)) return;
        }
      }
      if (stopped) return;
      setSandboxes((list) => {
        const rest = (list ?? []).filter((s) => s.sandboxID !== id);
        return fresh ? [fresh, ...rest].sort((a, b) => b.startedAt.localeCompare(a.startedAt)) : rest;
      });
    };
    (async () => {
      try {
        setError(undefined);
        const tail = await ledgerTail(api);
        const list = await api.listSandboxes();
        if (stopped) return;
        setSandboxes(list);
        follow = followEvents({
          credential: api.credential,
          path: "/warren/v1/events/stream",
          cursor: tail,
          onStatus: (s) => setStatus(s),
          onEvent: (event) => {
            const ledger = JSON.parse(event.data) as LedgerEvent;
            const gone = ledger.toState !== null && GONE.has(ledger.toState);
            // One refresh at a time per sandbox, in ledger order: a slow read never undoes a later kill.
            const previous = chains.get(ledger.sandboxID) ?? Promise.resolve();
            const next = previous.then(() => refresh(ledger.sandboxID, gone));
            chains.set(ledger.sandboxID, next);
            void next.finally(() => chains.get(ledger.sandboxID) === next && chains.delete(ledger.sandboxID));
          },
        });
      } catch (e) {
        if (!stopped) setError(e);
      }
    })();
    return () => {
      stopped = true;
      follow?.stop();
    };
  }, [api, generation]);

  return { sandboxes, error, status, reload: () => setGeneration((g) => g + 1) };
}
