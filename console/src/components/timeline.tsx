import { useEffect, useState } from "preact/hooks";
import type { LedgerEvent, WarrenApi } from "../api.js";
import { clockTime } from "../format.js";
import { followEvents } from "../sse.js";
import { Empty, ErrorBox, Loading } from "./common.js";

/** A sandbox's ledger: what is stored, then followed live from the last id (SSE). */
export function Timeline(props: { api: WarrenApi; sandboxId: string }) {
  const { api, sandboxId } = props;
  const [events, setEvents] = useState<LedgerEvent[]>();
  const [error, setError] = useState<unknown>();
  const [live, setLive] = useState(false);

  useEffect(() => {
    let stopped = false;
    let follow: { stop: () => void } | undefined;
    (async () => {
      try {
        let cursor = "0";
        const all: LedgerEvent[] = [];
        for (;;) {
          const page = await api.events(sandboxId, cursor, 1000);
          all.push(...page.events);
          cursor = page.cursor;
          if (page.events.length < 1000) break;
        }
        if (stopped) return;
        setEvents(all);
        follow = followEvents({
          credential: api.credential,
          path: `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/events/stream`,
          cursor,
          onStatus: (s) => setLive(s === "live"),
          onEvent: (event) => {
            const ledger = JSON.parse(event.data) as LedgerEvent;
            setEvents((list) => [...(list ?? []), ledger]);
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
  }, [api, sandboxId]);

  if (error) return <ErrorBox error={error} />;
  if (!events) return <Loading what="the timeline" />;
  return (
    <div>
      <p class="hint">{live ? "Following the ledger live." : "Connecting to the live ledger…"}</p>
      {events.length === 0 ? (
        <Empty title="No events yet." />
      ) : (
        <ol class="timeline" data-testid="timeline">
          {events.map((e) => (
            <li key={e.id} class={`event event-${e.type.replace(/\./g, "-")}`}>
              <time dateTime={e.timestamp}>{clockTime(e.timestamp)}</time>
              <strong>{e.type}</strong>
              {e.toState ? (
                <span class="muted">
                  {e.fromState ?? "–"} → {e.toState}
                </span>
              ) : null}
              {e.data && Object.keys(e.data).length > 0 ? <code class="data">{JSON.stringify(e.data)}</code> : null}
            </li>
          ))}
        </ol>
      )}
    </div>
  );
}
