import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import type { ListedSandbox, WarrenApi } from "../api.js";
import { ConfirmButton, Empty, ErrorBox, Link, Loading, OutcomeBar, useAction } from "../components/common.js";
import { matchesSearch, shortDuration } from "../format.js";
import { useLiveSandboxes } from "../live-sandboxes.js";

/** Re-renders every second so ages and time-left stay true without refetching anything. */
export function useNow(): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, []);
  return now;
}

export function SandboxesPage(props: { api: WarrenApi }) {
  const { api } = props;
  const live = useLiveSandboxes(api);
  const [search, setSearch] = useState("");
  const [state, setState] = useState<"all" | "running" | "paused">("all");
  const { outcome, busy, run } = useAction();
  const now = useNow();
  const searchBox = useRef<HTMLInputElement>(null);

  // "/" jumps to the search box from anywhere on the page (not while typing in another field).
  useEffect(() => {
    const onKey = (event: KeyboardEvent) => {
      const target = event.target as HTMLElement | null;
      if (event.key !== "/" || target?.closest("input, textarea, select, .xterm")) return;
      event.preventDefault();
      searchBox.current?.focus();
    };
    addEventListener("keydown", onKey);
    return () => removeEventListener("keydown", onKey);
  }, []);

  const shown = useMemo(
    () => (live.sandboxes ?? []).filter((s) => (state === "all" || s.state === state) && matchesSearch(s, search)),
    [live.sandboxes, search, state],
  );

  return (
    <section aria-labelledby="sandboxes-title">
      <header class="page-header">
        <h1 id="sandboxes-title">Sandboxes</h1>
        <span class={`live live-${live.status}`} data-testid="live-status">
          {live.status === "live" ? "Live" : live.status === "connecting" ? "Connecting…" : "Reconnecting…"}
        </span>
      </header>
      <CreateForm api={api} run={run} busy={busy} />
      <div class="toolbar">
        <label>
          Search
          <input
            type="search"
            ref={searchBox}
            aria-keyshortcuts="/"
            placeholder="id, template, node, key=value"
            value={search}
            onInput={(e) => setSearch(e.currentTarget.value)}
          />
        </label>
        <label>
          State
          <select value={state} onChange={(e) => setState(e.currentTarget.value as typeof state)}>
            <option value="all">All</option>
            <option value="running">Running</option>
            <option value="paused">Paused</option>
          </select>
        </label>
        <span class="count">{live.sandboxes ? `${shown.length} of ${live.sandboxes.length}` : ""}</span>
      </div>
      <OutcomeBar outcome={outcome} />
      {live.error ? (
        <ErrorBox error={live.error} retry={live.reload} />
      ) : !live.sandboxes ? (
        <Loading what="sandboxes" />
      ) : live.sandboxes.length === 0 ? (
        <Empty title="No sandboxes are running or paused.">
          Create one above, or with the SDK: it appears here as soon as it starts.
        </Empty>
      ) : shown.length === 0 ? (
        <Empty title="No sandbox matches the filters." />
      ) : (
        <table class="table" data-testid="sandbox-table">
          <thead>
            <tr>
              <th scope="col">Sandbox</th>
              <th scope="col">State</th>
              <th scope="col">Template</th>
              <th scope="col">Node</th>
              <th scope="col">Metadata</th>
              <th scope="col">Age</th>
              <th scope="col">Ends in</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {shown.map((s) => (
              <SandboxRow key={s.sandboxID} api={api} sandbox={s} now={now} run={run} busy={busy} />
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

type Run = (label: string, action: () => Promise<string>) => Promise<void>;

function CreateForm(props: { api: WarrenApi; run: Run; busy: string | undefined }) {
  const [template, setTemplate] = useState("base");
  const [timeout, setTimeoutValue] = useState("300");
  const [metadata, setMetadata] = useState("");
  const submit = (event: Event) => {
    event.preventDefault();
    void props.run("Create", async () => {
      const meta: Record<string, string> = {};
      for (const pair of metadata.split(/[,\s]+/).filter(Boolean)) {
        const eq = pair.indexOf("=");
        if (eq <= 0) throw new Error(`metadata '${pair}' is not key=value`);
        meta[pair.slice(0, eq)] = pair.slice(eq + 1);
      }
      const seconds = Number(timeout);
      if (!Number.isInteger(seconds) || seconds < 1)
        throw new Error(`timeout '${timeout}' is not a whole number of seconds`);
      const created = await props.api.createSandbox(template.trim(), seconds, meta);
      return `Created sandbox ${created.sandboxID} from ${template}`;
    });
  };
  return (
    <form class="toolbar create" onSubmit={submit} aria-label="Create a sandbox">
      <label>
        Template
        <input required value={template} onInput={(e) => setTemplate(e.currentTarget.value)} name="template" />
      </label>
      <label>
        Timeout (s)
        <input
          required
          inputMode="numeric"
          class="narrow"
          value={timeout}
          onInput={(e) => setTimeoutValue(e.currentTarget.value)}
          name="timeout"
        />
      </label>
      <label>
        Metadata
        <input placeholder="key=value, …" value={metadata} onInput={(e) => setMetadata(e.currentTarget.value)} />
      </label>
      <button type="submit" class="primary" disabled={props.busy !== undefined}>
        {props.busy === "Create" ? "Creating…" : "Create sandbox"}
      </button>
    </form>
  );
}

export function SandboxActions(props: {
  api: WarrenApi;
  sandbox: ListedSandbox;
  run: Run;
  busy: string | undefined;
  onKilled?: () => void;
  /** Snapshot and fork too (the sandbox's own page). */
  full?: boolean;
}) {
  const { api, sandbox: s, run } = props;
  const [timeout, setTimeoutValue] = useState("");
  const busy = props.busy !== undefined;
  return (
    <div class="actions">
      {s.state === "running" ? (
        <button
          type="button"
          disabled={busy}
          onClick={() =>
            run("Pause", async () => {
              await api.pauseSandbox(s.sandboxID);
              return `Paused ${s.sandboxID}`;
            })
          }
        >
          Pause
        </button>
      ) : (
        <button
          type="button"
          disabled={busy}
          onClick={() =>
            run("Resume", async () => {
              await api.resumeSandbox(s.sandboxID, 300);
              return `Resumed ${s.sandboxID}`;
            })
          }
        >
          Resume
        </button>
      )}
      <form
        class="inline"
        onSubmit={(event) => {
          event.preventDefault();
          void run("Set timeout", async () => {
            const seconds = Number(timeout);
            if (!Number.isInteger(seconds) || seconds < 0) {
              throw new Error(`'${timeout}' is not a whole number of seconds`);
            }
            await api.setTimeout(s.sandboxID, seconds);
            setTimeoutValue("");
            return `${s.sandboxID} now ends in ${shortDuration(seconds * 1000)}`;
          });
        }}
      >
        <input
          class="narrow"
          aria-label={`New timeout in seconds for ${s.sandboxID}`}
          placeholder="secs"
          inputMode="numeric"
          value={timeout}
          onInput={(e) => setTimeoutValue(e.currentTarget.value)}
        />
        <button type="submit" disabled={busy || timeout === ""}>
          Set timeout
        </button>
      </form>
      {props.full ? (
        <>
          <button
            type="button"
            disabled={busy}
            onClick={() =>
              run("Snapshot", async () => {
                const made = await api.snapshot(s.sandboxID);
                return `Snapshot ${made.names[0] ?? made.snapshotID} taken: create sandboxes from it like a template`;
              })
            }
          >
            Snapshot
          </button>
          <button
            type="button"
            disabled={busy}
            onClick={() =>
              run("Fork", async () => {
                const [result] = await api.fork(s.sandboxID);
                if (!result) throw new Error("the api answered no fork");
                if ("error" in result) throw new Error(result.error.message);
                return `Forked into ${result.sandbox.sandboxID}`;
              })
            }
          >
            Fork
          </button>
        </>
      ) : null}
      <ConfirmButton
        label="Kill"
        confirm="Confirm kill"
        disabled={busy}
        onConfirm={() =>
          run("Kill", async () => {
            await api.killSandbox(s.sandboxID);
            props.onKilled?.();
            return `Killed ${s.sandboxID}`;
          })
        }
      />
    </div>
  );
}

function SandboxRow(props: {
  api: WarrenApi;
  sandbox: ListedSandbox;
  now: number;
  run: Run;
  busy: string | undefined;
}) {
  const s = props.sandbox;
  const age = props.now - new Date(s.startedAt).getTime();
  const left = new Date(s.endAt).getTime() - props.now;
  return (
    <tr data-sandbox-id={s.sandboxID}>
      <td>
        <Link href={`/sandboxes/${s.sandboxID}`} class="mono">
          {s.sandboxID}
        </Link>
      </td>
      <td>
        <span class={`badge badge-${s.state}`}>{s.state}</span>
      </td>
      <td>{s.alias ?? s.templateID}</td>
      <td class="mono" data-testid="sandbox-node">
        {s.nodeID ?? "–"}
      </td>
      <td>
        {Object.entries(s.metadata ?? {}).map(([k, v]) => (
          <span class="chip" key={k}>
            {k}={v}
          </span>
        ))}
      </td>
      <td>{shortDuration(age)}</td>
      <td>{s.state === "paused" ? "paused" : shortDuration(left)}</td>
      <td>
        <SandboxActions api={props.api} sandbox={s} run={props.run} busy={props.busy} />
      </td>
    </tr>
  );
}
