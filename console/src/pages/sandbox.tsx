import { useEffect, useState } from "preact/hooks";
import { ApiError, type ConsoleSettings, type SandboxDetail, type WarrenApi } from "../api.js";
import { Empty, ErrorBox, Link, Loading, OutcomeBar, useAction, useLazy } from "../components/common.js";
import { FileBrowser } from "../components/files.js";
import { Logs } from "../components/logs.js";
import { Timeline } from "../components/timeline.js";
import { ENVD_PORT, EnvdConnection, sandboxPortUrl } from "../envd.js";
import { shortDuration } from "../format.js";
import { followEvents } from "../sse.js";
import { SandboxActions, useNow } from "./sandboxes.js";

const loadTerminal = () => import("../components/terminal.js").then((m) => m.Terminal);
const loadMetrics = () => import("../components/metrics.js").then((m) => m.Metrics);

function LazyTerminal(props: { envd: EnvdConnection }) {
  const Terminal = useLazy(loadTerminal);
  return Terminal ? <Terminal {...props} /> : <Loading what="the terminal" />;
}

function LazyMetrics(props: { api: WarrenApi; sandboxId: string; running: boolean }) {
  const Metrics = useLazy(loadMetrics);
  return Metrics ? <Metrics {...props} /> : <Loading what="the charts" />;
}

const TABS = ["timeline", "metrics", "logs", "files", "terminal", "ports"] as const;
type Tab = (typeof TABS)[number];

export function SandboxPage(props: { api: WarrenApi; settings: ConsoleSettings; sandboxId: string; tab?: string }) {
  const { api, sandboxId } = props;
  const tab: Tab = (TABS as readonly string[]).includes(props.tab ?? "") ? (props.tab as Tab) : "timeline";
  const [detail, setDetail] = useState<SandboxDetail>();
  const [error, setError] = useState<unknown>();
  const [gone, setGone] = useState(false);
  const { outcome, busy, run } = useAction();
  const now = useNow();

  // The sandbox's own ledger stream: every event re-reads its detail, so state and timeout are never stale.
  useEffect(() => {
    let stopped = false;
    const load = async () => {
      try {
        const fresh = await api.getSandbox(sandboxId);
        if (!stopped) {
          setDetail(fresh);
          setGone(false);
        }
      } catch (e) {
        if (stopped) return;
        if (e instanceof ApiError && e.status === 404) setGone(true);
        else setError(e);
      }
    };
    void load();
    const follow = followEvents({
      credential: api.credential,
      path: `/warren/v1/sandboxes/${encodeURIComponent(sandboxId)}/events/stream`,
      onEvent: () => void load(),
    });
    return () => {
      stopped = true;
      follow.stop();
    };
  }, [api, sandboxId]);

  if (error) return <ErrorBox error={error} />;
  if (gone) {
    return (
      <Empty title={`Sandbox ${sandboxId} is not running or paused.`}>
        It was killed, timed out or never belonged to this team. <Link href="/sandboxes">Back to the list</Link>
      </Empty>
    );
  }
  if (!detail) return <Loading what={`sandbox ${sandboxId}`} />;
  const running = detail.state === "running";
  return (
    <section aria-labelledby="sandbox-title">
      <nav class="crumbs" aria-label="Breadcrumb">
        <Link href="/sandboxes">Sandboxes</Link> / <span class="mono">{sandboxId}</span>
      </nav>
      <header class="page-header">
        <h1 id="sandbox-title" class="mono">
          {sandboxId}
        </h1>
        <span class={`badge badge-${detail.state}`} data-testid="sandbox-state">
          {detail.state}
        </span>
      </header>
      <dl class="facts">
        <div>
          <dt>Template</dt>
          <dd>{detail.alias ?? detail.templateID}</dd>
        </div>
        <div>
          <dt>Node</dt>
          <dd class="mono" data-testid="sandbox-node">
            {detail.nodeID ?? "–"}
          </dd>
        </div>
        <div>
          <dt>Started</dt>
          <dd>{new Date(detail.startedAt).toLocaleString()}</dd>
        </div>
        <div>
          <dt>{running ? "Ends in" : "Paused at"}</dt>
          <dd>
            {running ? shortDuration(new Date(detail.endAt).getTime() - now) : new Date(detail.endAt).toLocaleString()}
          </dd>
        </div>
        <div>
          <dt>Resources</dt>
          <dd>
            {detail.cpuCount} vCPU · {detail.memoryMB} MiB · {detail.diskSizeMB} MiB disk
          </dd>
        </div>
        <div>
          <dt>On timeout</dt>
          <dd>{detail.lifecycle?.onTimeout ?? "kill"}</dd>
        </div>
        <div>
          <dt>envd</dt>
          <dd>{detail.envdVersion}</dd>
        </div>
      </dl>
      <SandboxActions api={api} sandbox={detail} run={run} busy={busy} full />
      <OutcomeBar outcome={outcome} />
      <nav class="tabs" aria-label="Sandbox views">
        {TABS.map((t) => (
          <Link key={t} href={`/sandboxes/${sandboxId}/${t}`} class="tab" current={t === tab}>
            {t[0]!.toUpperCase() + t.slice(1)}
          </Link>
        ))}
      </nav>
      <div class="tab-panel">
        {tab === "timeline" ? <Timeline api={api} sandboxId={sandboxId} /> : null}
        {tab === "metrics" ? <LazyMetrics api={api} sandboxId={sandboxId} running={running} /> : null}
        {tab === "logs" ? <Logs api={api} sandboxId={sandboxId} /> : null}
        {tab === "files" || tab === "terminal" ? (
          <EnvdPanel api={api} settings={props.settings} sandboxId={sandboxId} running={running} tab={tab} />
        ) : null}
        {tab === "ports" ? <Ports settings={props.settings} sandboxId={sandboxId} /> : null}
      </div>
    </section>
  );
}

/** Files and terminal need envd: its access token (connect) and the proxy's address for the sandbox. */
function EnvdPanel(props: {
  api: WarrenApi;
  settings: ConsoleSettings;
  sandboxId: string;
  running: boolean;
  tab: "files" | "terminal";
}) {
  const { api, settings, sandboxId, running } = props;
  const [envd, setEnvd] = useState<EnvdConnection>();
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    if (!running || !settings.sandboxUrl) return;
    let stopped = false;
    const template = settings.sandboxUrl;
    api.connectSandbox(sandboxId).then(
      (access) =>
        !stopped && setEnvd(new EnvdConnection(sandboxPortUrl(template, sandboxId, ENVD_PORT), access.envdAccessToken)),
      (e) => !stopped && setError(e),
    );
    return () => {
      stopped = true;
    };
  }, [api, settings.sandboxUrl, sandboxId, running]);
  if (!settings.sandboxUrl) {
    return (
      <Empty title="The console cannot reach sandboxes.">
        Serve the console as <code>api.&lt;domain&gt;/console</code> behind the proxy, or set{" "}
        <code>WARREN_CONSOLE_SANDBOX_URL</code> on the api.
      </Empty>
    );
  }
  if (!running) return <Empty title="The sandbox is paused.">Resume it to use its files and terminal.</Empty>;
  if (error) return <ErrorBox error={error} />;
  if (!envd) return <Loading what="the sandbox's envd" />;
  return props.tab === "files" ? <FileBrowser envd={envd} /> : <LazyTerminal envd={envd} />;
}

function Ports(props: { settings: ConsoleSettings; sandboxId: string }) {
  const [port, setPort] = useState("8080");
  const template = props.settings.sandboxUrl;
  if (!template) return <Empty title="No sandbox URL is configured for this console." />;
  const n = Number(port);
  const valid = Number.isInteger(n) && n >= 1 && n <= 65535;
  return (
    <div>
      <p>
        envd: <code class="mono">{sandboxPortUrl(template, props.sandboxId, ENVD_PORT)}</code>
      </p>
      <label>
        Port <input class="narrow" inputMode="numeric" value={port} onInput={(e) => setPort(e.currentTarget.value)} />
      </label>{" "}
      {valid ? (
        <code class="mono" data-testid="port-url">
          {sandboxPortUrl(template, props.sandboxId, n)}
        </code>
      ) : (
        <span role="alert">'{port}' is not a port (1–65535)</span>
      )}
      <p class="hint">Private sandboxes need their traffic access token in the e2b-traffic-access-token header.</p>
    </div>
  );
}
