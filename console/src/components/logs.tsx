import { useEffect, useMemo, useState } from "preact/hooks";
import type { LogEntry, WarrenApi } from "../api.js";
import { clockTime } from "../format.js";
import { ledgerTail } from "../live-sandboxes.js";
import { followEvents } from "../sse.js";
import { Empty, ErrorBox, Loading } from "./common.js";

/** envd's own lines are read from the sandbox's node on request (they are not in the ledger): re-read this often. */
const FOLLOW_MS = 3000;
const LEVELS = ["all", "debug", "info", "warn", "error"] as const;

/**
 * The sandbox's log (lifecycle events and envd's own lines), following while the box is ticked: every event of
 * the sandbox's ledger (SSE) re-reads it at once, so lifecycle lines show live; envd's lines come with the timer.
 */
export function Logs(props: { api: WarrenApi; sandboxId: string }) {
  const { api, sandboxId } = props;
  const [entries, setEntries] = useState<LogEntry[]>();
  const [error, setError] = useState<unknown>();
  const [follow, setFollow] = useState(true);
  const [level, setLevel] = useState<(typeof LEVELS)[number]>("all");
  const [search, setSearch] = useState("");

  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    // Reads may overlap (a ledger event during a timed read): only the newest one started may set the entries.
    let started = 0;
    let applied = 0;
    const load = async () => {
      const mine = ++started;
      clearTimeout(timer);
      try {
        const page = await api.logs(sandboxId);
        if (stopped || mine < applied) return;
        applied = mine;
        setEntries(page.logs);
        setError(undefined);
      } catch (e) {
        if (!stopped) setError(e);
      }
      if (!stopped && follow && mine === started) timer = setTimeout(load, FOLLOW_MS);
    };
    let ledger: { stop: () => void } | undefined;
    void (async () => {
      // From the ledger's tail (read before the log): an event in between re-reads it, none replays old history.
      const tail = follow ? await ledgerTail(api, sandboxId).catch(() => undefined) : undefined;
      await load();
      if (stopped || tail === undefined) return;
      ledger = followEvents({
        credential: api.credential,
        path: `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/events/stream`,
        cursor: tail,
        onEvent: () => void load(),
      });
    })();
    return () => {
      stopped = true;
      clearTimeout(timer);
      ledger?.stop();
    };
  }, [api, sandboxId, follow]);

  const shown = useMemo(() => {
    const q = search.trim().toLowerCase();
    return (entries ?? []).filter(
      (e) => (level === "all" || e.level === level) && (!q || e.message.toLowerCase().includes(q)),
    );
  }, [entries, level, search]);

  return (
    <div>
      <div class="toolbar">
        <label>
          Level
          <select value={level} onChange={(e) => setLevel(e.currentTarget.value as typeof level)}>
            {LEVELS.map((l) => (
              <option key={l} value={l}>
                {l}
              </option>
            ))}
          </select>
        </label>
        <label>
          Search
          <input type="search" value={search} onInput={(e) => setSearch(e.currentTarget.value)} />
        </label>
        <label class="check">
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.currentTarget.checked)} /> Follow
        </label>
      </div>
      {error && !entries ? (
        <ErrorBox error={error} />
      ) : !entries ? (
        <Loading what="logs" />
      ) : shown.length === 0 ? (
        <Empty title={entries.length === 0 ? "No log lines yet." : "No line matches the filters."} />
      ) : (
        <div class="logs mono" data-testid="logs" role="log">
          {shown.map((e, i) => (
            <div key={i} class={`log log-${e.level}`}>
              <time dateTime={e.timestamp}>{clockTime(e.timestamp)}</time> <span class="level">{e.level}</span>{" "}
              <span class="source">{e.fields.source ?? ""}</span> {e.message}
            </div>
          ))}
        </div>
      )}
    </div>
  );
}
