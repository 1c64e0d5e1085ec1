import { useState } from "preact/hooks";
import type { ApiKeyInfo, CreatedKey, Team, WarrenApi } from "../api.js";
import { ConfirmButton, Empty, ErrorBox, Loading, OutcomeBar, useAction, useLoad } from "../components/common.js";
import { shortDuration } from "../format.js";
import { useNow } from "./sandboxes.js";

export function NodesPage(props: { api: WarrenApi }) {
  const [nodes, reload] = useLoad(() => props.api.nodes(), [props.api]);
  const { outcome, busy, run } = useAction();
  const now = useNow();
  return (
    <section aria-labelledby="nodes-title">
      <header class="page-header">
        <h1 id="nodes-title">Nodes</h1>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </header>
      <OutcomeBar outcome={outcome} />
      {nodes.status === "loading" ? (
        <Loading what="nodes" />
      ) : nodes.status === "error" ? (
        <ErrorBox error={nodes.error} retry={reload} />
      ) : nodes.value.length === 0 ? (
        <Empty title="No node agent has registered yet." />
      ) : (
        <table class="table" data-testid="node-table">
          <thead>
            <tr>
              <th scope="col">Node</th>
              <th scope="col">State</th>
              <th scope="col">Address</th>
              <th scope="col">Last heartbeat</th>
              <th scope="col">Scheduling</th>
            </tr>
          </thead>
          <tbody>
            {nodes.value.map((n) => (
              <tr key={n.id}>
                <td class="mono">{n.id}</td>
                <td>
                  <span class={`badge badge-${n.state}`}>{n.state}</span>
                </td>
                <td class="mono">{n.addr}</td>
                <td>{shortDuration(now - new Date(n.lastSeenAt).getTime())} ago</td>
                <td>
                  {n.cordonedAt ? "cordoned " : "schedulable "}
                  <button
                    type="button"
                    disabled={busy !== undefined}
                    onClick={() =>
                      void run(n.cordonedAt ? "Uncordon" : "Cordon", async () => {
                        await props.api.cordon(n.id, !n.cordonedAt);
                        reload();
                        return `${n.cordonedAt ? "Uncordoned" : "Cordoned"} ${n.id}`;
                      })
                    }
                  >
                    {n.cordonedAt ? "Uncordon" : "Cordon"}
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

/** A team's keys (revoked ones too), each live one with its Revoke button. Never the key itself. */
function TeamKeys(props: {
  api: WarrenApi;
  team: Team;
  /** Bumped when a key is created elsewhere on the page, so the list reads it. */
  version: number;
  run: ReturnType<typeof useAction>["run"];
}) {
  const { api, team, run } = props;
  const [keys, reload] = useLoad(() => api.listKeys(team.id), [api, team.id, props.version]);
  if (keys.status === "loading") return <Loading what={`${team.name}'s API keys`} />;
  if (keys.status === "error") return <ErrorBox error={keys.error} retry={reload} />;
  if (keys.value.length === 0)
    return <Empty title={`${team.name} has no API keys.`}>Create one with New API key.</Empty>;
  return (
    <table class="table subtable" data-testid={`keys-${team.id}`} aria-label={`API keys of ${team.name}`}>
      <thead>
        <tr>
          <th scope="col">Key id</th>
          <th scope="col">Name</th>
          <th scope="col">Prefix</th>
          <th scope="col">Created</th>
          <th scope="col">Status</th>
          <th scope="col">Actions</th>
        </tr>
      </thead>
      <tbody>
        {keys.value.map((k: ApiKeyInfo) => (
          <tr key={k.id} data-key-id={k.id}>
            <td class="mono">{k.id}</td>
            <td>
              {k.name || <span class="muted">(no name)</span>}
              {k.approver ? (
                <span class="chip" title="May change the team's exec policy and approve its reviews">
                  approver
                </span>
              ) : null}
            </td>
            <td class="mono">{k.prefix}…</td>
            <td>{new Date(k.createdAt).toLocaleString()}</td>
            <td data-testid="key-status">
              {k.revokedAt ? (
                <span class="badge badge-revoked" title={new Date(k.revokedAt).toLocaleString()}>
                  revoked
                </span>
              ) : (
                <span class="badge badge-active">active</span>
              )}
            </td>
            <td>
              {k.revokedAt ? null : (
                <ConfirmButton
                  label="Revoke"
                  confirm="Confirm revoke"
                  onConfirm={() =>
                    void run("Revoke", async () => {
                      await api.revokeKey(k.id);
                      reload();
                      return `Revoked ${k.id} (${team.name})`;
                    })
                  }
                />
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

// control-plane runtime/egress/policy.ts TEAM_EGRESS_MODES.
const EGRESS_MODES = ["open", "closed", "forbidden"];

function TeamRow(props: {
  api: WarrenApi;
  team: Team;
  run: ReturnType<typeof useAction>["run"];
  onChange: () => void;
  onKey: (k: CreatedKey) => void;
}) {
  const { api, team: t, run } = props;
  const [showKeys, setShowKeys] = useState(false);
  const [keysVersion, setKeysVersion] = useState(0);
  const [limits, setLimits] = useState({
    maxConcurrentSandboxes: String(t.maxConcurrentSandboxes),
    maxLengthHours: String(t.maxLengthHours),
    maxCreatesPerMinute: String(t.maxCreatesPerMinute),
    egressMode: t.egressMode,
  });
  const field = (key: keyof typeof limits, label: string) => (
    <input
      class="narrow"
      aria-label={`${label} for ${t.name}`}
      value={limits[key]}
      onInput={(e) => setLimits({ ...limits, [key]: e.currentTarget.value })}
    />
  );
  return (
    <>
      <tr data-team-id={t.id}>
        <td>
          {t.name}
          <div class="mono muted">{t.id}</div>
        </td>
        <td>{field("maxConcurrentSandboxes", "Concurrent sandboxes")}</td>
        <td>{field("maxLengthHours", "Max hours")}</td>
        <td>{field("maxCreatesPerMinute", "Creates per minute")}</td>
        <td>
          <select
            aria-label={`Egress mode for ${t.name}`}
            value={limits.egressMode}
            onChange={(e) => setLimits({ ...limits, egressMode: e.currentTarget.value })}
          >
            {[...new Set([...EGRESS_MODES, t.egressMode])].map((m) => (
              <option key={m} value={m}>
                {m}
              </option>
            ))}
          </select>
        </td>
        <td>
          <div class="actions">
            <button
              type="button"
              onClick={() =>
                void run("Save limits", async () => {
                  await api.updateTeam(t.id, {
                    maxConcurrentSandboxes: Number(limits.maxConcurrentSandboxes),
                    maxLengthHours: Number(limits.maxLengthHours),
                    maxCreatesPerMinute: Number(limits.maxCreatesPerMinute),
                    egressMode: limits.egressMode,
                  });
                  props.onChange();
                  return `Saved ${t.name}'s limits`;
                })
              }
            >
              Save
            </button>
            <button
              type="button"
              onClick={() =>
                void run("New key", async () => {
                  props.onKey(await api.createKey(t.id, "console"));
                  setKeysVersion((v) => v + 1);
                  return `Created an API key for ${t.name}`;
                })
              }
            >
              New API key
            </button>
            <button
              type="button"
              aria-expanded={showKeys}
              aria-label={`${showKeys ? "Hide" : "Show"} API keys of ${t.name}`}
              onClick={() => setShowKeys(!showKeys)}
            >
              {showKeys ? "Hide keys" : "Keys"}
            </button>
          </div>
        </td>
      </tr>
      {showKeys ? (
        <tr class="expanded">
          <td colSpan={6}>
            <TeamKeys api={api} team={t} version={keysVersion} run={run} />
          </td>
        </tr>
      ) : null}
    </>
  );
}

export function TeamsPage(props: { api: WarrenApi }) {
  const { api } = props;
  const [teams, reload] = useLoad(() => api.teams(), [api]);
  const { outcome, run } = useAction();
  const [name, setName] = useState("");
  const [created, setCreated] = useState<CreatedKey>();
  return (
    <section aria-labelledby="teams-title">
      <header class="page-header">
        <h1 id="teams-title">Teams and API keys</h1>
      </header>
      <div class="toolbar">
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            void run("Create team", async () => {
              const made = await api.createTeam(name.trim());
              setCreated(made.apiKey);
              setName("");
              reload();
              return `Created team ${made.team.name}`;
            });
          }}
        >
          <input
            aria-label="Team name"
            placeholder="team name"
            value={name}
            onInput={(e) => setName(e.currentTarget.value)}
          />
          <button type="submit" class="primary" disabled={!name.trim()}>
            Create team
          </button>
        </form>
      </div>
      {created ? (
        <output class="secret">
          New API key (shown once, copy it now): <code class="mono">{created.key}</code> · id <code>{created.id}</code>{" "}
          <button type="button" onClick={() => setCreated(undefined)}>
            Hide
          </button>
        </output>
      ) : null}
      <OutcomeBar outcome={outcome} />
      {teams.status === "loading" ? (
        <Loading what="teams" />
      ) : teams.status === "error" ? (
        <ErrorBox error={teams.error} retry={reload} />
      ) : teams.value.length === 0 ? (
        <Empty title="No teams yet." />
      ) : (
        <table class="table">
          <thead>
            <tr>
              <th scope="col">Team</th>
              <th scope="col">Concurrent</th>
              <th scope="col">Max hours</th>
              <th scope="col">Creates/min</th>
              <th scope="col">Egress</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {teams.value.map((t) => (
              <TeamRow key={t.id} api={api} team={t} run={run} onChange={reload} onKey={setCreated} />
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
