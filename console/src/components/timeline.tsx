import { useEffect, useState } from "preact/hooks";
import type { LedgerEvent, WarrenApi } from "../api.js";
import { clockTime } from "../format.js";
import { followEvents } from "../sse.js";
import { Empty, ErrorBox, Link, Loading } from "./common.js";

const str = (value: unknown): string | undefined => (typeof value === "string" && value ? value : undefined);

/** An exec policy event (`exec.*`) in one line: what was asked, by whom, under which rule; its approval linked. */
function ExecSummary(props: { data: Record<string, unknown> }) {
  const { data } = props;
  const kind = str(data.kind);
  const asked = str(data.commandLine) ?? (kind && kind !== "start" ? `${kind} ${str(data.path) ?? ""}` : undefined);
  const facts = [
    str(data.rule) ? `rule "${data.rule}"` : undefined,
    str(data.user) ? `as ${data.user}` : undefined,
    str(data.cwd) ? `in ${data.cwd}` : undefined,
    str(data.reason) ? `reason: ${data.reason}` : undefined,
  ].filter(Boolean);
  return (
    <>
      {asked ? <code class="exec-request">{asked}</code> : null}
      {facts.length > 0 ? <span class="muted">{facts.join(" · ")}</span> : null}
      {str(data.approvalId) ? (
        <Link href="/approvals" class="mono">
          {str(data.approvalId)!}
        </Link>
      ) : null}
    </>
  );
}

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
              {e.data && e.type.startsWith("exec.") ? (
                <ExecSummary data={e.data} />
              ) : e.data && Object.keys(e.data).length > 0 ? (
                <code class="data">{JSON.stringify(e.data)}</code>
              ) : null}
            </li>
          ))}
        </ol>
      )}
    </div>
  );
}
