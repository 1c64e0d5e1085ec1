import "@xterm/xterm/css/xterm.css";
import "uplot/dist/uPlot.min.css";
import "./styles.css";
import { render } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import { type ConsoleSettings, WarrenApi } from "./api.js";
import { isPending } from "./approvals.js";
import { Empty, ErrorBox, Link, Loading, useLazy } from "./components/common.js";
import { type LiveApprovalsState, useLiveApprovals } from "./live-approvals.js";
import { NodesPage, TeamsPage } from "./pages/admin.js";
import { SandboxesPage } from "./pages/sandboxes.js";
import { SignIn } from "./pages/sign-in.js";
import { TemplatePage, TemplatesPage } from "./pages/templates.js";
import { match, navigate, usePath } from "./router.js";
import { type Credential, clearCredential, loadCredential, saveCredential } from "./session.js";

function Nav(props: { credential: Credential; path: string; pending: number | undefined; onSignOut: () => void }) {
  const items =
    props.credential.kind === "apiKey"
      ? [
          ["/sandboxes", "Sandboxes"],
          ["/snapshots", "Snapshots"],
          ["/templates", "Templates"],
          ["/approvals", "Approvals"],
        ]
      : [
          ["/nodes", "Nodes"],
          ["/teams", "Teams & keys"],
        ];
  return (
    <header class="topbar">
      <Link href="/" class="brand">
        Warren
      </Link>
      <nav aria-label="Main">
        {items.map(([href, label]) => (
          <Link key={href} href={href!} current={props.path.startsWith(href!)}>
            {label}
            {href === "/approvals" && props.pending ? (
              <span class="nav-count" data-testid="pending-count" title="Requests waiting for a decision">
                {props.pending}
                <span class="visually-hidden"> pending</span>
              </span>
            ) : null}
          </Link>
        ))}
      </nav>
      <span class="who">{props.credential.kind === "apiKey" ? "API key" : "Admin"}</span>
      <button type="button" onClick={props.onSignOut}>
        Sign out
      </button>
    </header>
  );
}

// A sandbox's page (envd client, protobuf, file browser) loads when first opened, not with the sign-in page.
const loadSandboxPage = () => import("./pages/sandbox.js").then((m) => m.SandboxPage);

function LazySandboxPage(props: {
  api: WarrenApi;
  settings: ConsoleSettings;
  sandboxId: string;
  tab?: string | undefined;
}) {
  const SandboxPage = useLazy(loadSandboxPage);
  return SandboxPage ? <SandboxPage {...props} /> : <Loading what="the sandbox page" />;
}

const loadSnapshotsPage = () => import("./pages/snapshots.js").then((m) => m.SnapshotsPage);

function LazySnapshotsPage(props: { api: WarrenApi }) {
  const SnapshotsPage = useLazy(loadSnapshotsPage);
  return SnapshotsPage ? <SnapshotsPage {...props} /> : <Loading what="the snapshots page" />;
}

const loadApprovalsPage = () => import("./pages/approvals.js").then((m) => m.ApprovalsPage);

function LazyApprovalsPage(props: { api: WarrenApi; live: LiveApprovalsState }) {
  const ApprovalsPage = useLazy(loadApprovalsPage);
  return ApprovalsPage ? <ApprovalsPage {...props} /> : <Loading what="the approvals page" />;
}

function Redirect(props: { to: string }) {
  useEffect(() => navigate(props.to, true), [props.to]);
  return null;
}

function Routes(props: { api: WarrenApi; settings: ConsoleSettings; path: string; approvals: LiveApprovalsState }) {
  const { api, path } = props;
  const admin = api.credential.kind === "admin";
  if (path === "/" || path === "") return <Redirect to={admin ? "/nodes" : "/sandboxes"} />;
  if (!admin) {
    if (match("/sandboxes", path)) return <SandboxesPage api={api} />;
    const sandbox = match("/sandboxes/:id/:tab?", path);
    if (sandbox) {
      return (
        <LazySandboxPage
          key={sandbox.id}
          api={api}
          settings={props.settings}
          sandboxId={sandbox.id!}
          tab={sandbox.tab}
        />
      );
    }
    if (match("/snapshots", path)) return <LazySnapshotsPage api={api} />;
    if (match("/approvals", path)) return <LazyApprovalsPage api={api} live={props.approvals} />;
    if (match("/templates", path)) return <TemplatesPage api={api} />;
    const template = match("/templates/:id", path);
    if (template) return <TemplatePage api={api} templateId={template.id!} />;
  } else {
    if (match("/nodes", path)) return <NodesPage api={api} />;
    if (match("/teams", path)) return <TeamsPage api={api} />;
  }
  return (
    <Empty title="Nothing here.">
      {admin
        ? "The admin token opens nodes and teams; sign in with an API key for sandboxes, snapshots, templates and approvals."
        : ""}{" "}
      <Link href="/">Home</Link>
    </Empty>
  );
}

function App() {
  const [credential, setCredential] = useState(loadCredential());
  const [settings, setSettings] = useState<ConsoleSettings | { error: unknown }>();
  const path = usePath();
  const api = useMemo(() => (credential ? new WarrenApi(credential) : undefined), [credential]);
  // One follower for the nav's pending count and the approvals page.
  const approvals = useLiveApprovals(api);
  const pending = approvals.lists?.pending.filter((a) => isPending(a, Date.now())).length;

  useEffect(() => {
    fetch("/console/settings.json")
      .then((res) =>
        res.ok ? (res.json() as Promise<ConsoleSettings>) : Promise.reject(new Error(`settings: HTTP ${res.status}`)),
      )
      .then(setSettings, (error) => setSettings({ error }));
  }, []);

  if (!credential || !api) {
    return (
      <SignIn
        onSignedIn={(c) => {
          saveCredential(c);
          setCredential(c);
          navigate(c.kind === "admin" ? "/nodes" : path === "/" ? "/sandboxes" : path, true);
        }}
      />
    );
  }
  return (
    <div class="shell">
      <Nav
        credential={credential}
        path={path}
        pending={pending}
        onSignOut={() => {
          clearCredential();
          setCredential(undefined);
        }}
      />
      <main class="content">
        {!settings ? (
          <Loading what="the console" />
        ) : "error" in settings ? (
          <ErrorBox error={settings.error} />
        ) : (
          <Routes api={api} settings={settings} path={path} approvals={approvals} />
        )}
      </main>
    </div>
  );
}

const root = document.getElementById("app");
if (root) render(<App />, root);
