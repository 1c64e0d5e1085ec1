import { useEffect, useState } from "preact/hooks";
import type { BuildLogEntry, WarrenApi } from "../api.js";
import { ConfirmButton, Empty, ErrorBox, Link, Loading, OutcomeBar, useAction, useLoad } from "../components/common.js";
import { clockTime } from "../format.js";
import { navigate } from "../router.js";

export function TemplatesPage(props: { api: WarrenApi }) {
  const [templates, reload] = useLoad(() => props.api.listTemplates(), [props.api]);
  return (
    <section aria-labelledby="templates-title">
      <header class="page-header">
        <h1 id="templates-title">Templates</h1>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </header>
      {templates.status === "loading" ? (
        <Loading what="templates" />
      ) : templates.status === "error" ? (
        <ErrorBox error={templates.error} retry={reload} />
      ) : templates.value.length === 0 ? (
        <Empty title="This team has built no templates.">
          Build one with the SDK (<code>Template.build</code>); the built-in <code>base</code> template is always there.
        </Empty>
      ) : (
        <table class="table">
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Latest build</th>
              <th scope="col">Builds</th>
              <th scope="col">Resources</th>
              <th scope="col">Sandboxes started</th>
            </tr>
          </thead>
          <tbody>
            {templates.value.map((t) => (
              <tr key={t.templateID}>
                <td>
                  <Link href={`/templates/${t.templateID}`}>{t.names[0] ?? t.templateID}</Link>
                </td>
                <td>
                  <span class={`badge badge-${t.buildStatus}`}>{t.buildStatus}</span>
                </td>
                <td>{t.buildCount}</td>
                <td>
                  {t.cpuCount} vCPU · {t.memoryMB} MiB
                </td>
                <td>{t.spawnCount}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

/** A build's log, read by cursor; while the build is not finished, the next page is read every 2 s. */
function BuildLog(props: { api: WarrenApi; templateId: string; buildId: string; finished: boolean }) {
  const [lines, setLines] = useState<BuildLogEntry[]>([]);
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    let stopped = false;
    let cursor = 0;
    let timer: ReturnType<typeof setTimeout> | undefined;
    setLines([]);
    const load = async () => {
      try {
        const page = await props.api.buildLogs(props.templateId, props.buildId, cursor);
        if (stopped) return;
        cursor += page.logs.length;
        if (page.logs.length > 0) setLines((old) => [...old, ...page.logs]);
        if (!props.finished || page.logs.length === 1000)
          timer = setTimeout(load, page.logs.length === 1000 ? 0 : 2000);
      } catch (e) {
        if (!stopped) setError(e);
      }
    };
    void load();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [props.api, props.templateId, props.buildId, props.finished]);
  if (error) return <ErrorBox error={error} />;
  if (lines.length === 0) return <Empty title="No log lines for this build." />;
  return (
    <div class="logs mono" role="log">
      {lines.map((l, i) => (
        <div key={i} class={`log log-${l.level}`}>
          <time dateTime={l.timestamp}>{clockTime(l.timestamp)}</time>{" "}
          {l.step ? <span class="source">{l.step}</span> : null} {l.message}
        </div>
      ))}
    </div>
  );
}

export function TemplatePage(props: { api: WarrenApi; templateId: string }) {
  const { api, templateId } = props;
  const [detail, reload] = useLoad(
    async () => ({ template: await api.getTemplate(templateId), tags: await api.templateTags(templateId) }),
    [api, templateId],
  );
  const [selected, setSelected] = useState<string>();
  const [newTag, setNewTag] = useState("");
  const { outcome, busy, run } = useAction();
  if (detail.status === "loading") return <Loading what={`template ${templateId}`} />;
  if (detail.status === "error") return <ErrorBox error={detail.error} retry={reload} />;
  const { template, tags } = detail.value;
  const name = template.names[0]?.split("/").pop() ?? template.templateID;
  const build = template.builds.find((b) => b.buildID === selected) ?? template.builds[0];
  return (
    <section aria-labelledby="template-title">
      <nav class="crumbs" aria-label="Breadcrumb">
        <Link href="/templates">Templates</Link> / {name}
      </nav>
      <header class="page-header">
        <h1 id="template-title">{template.names[0] ?? template.templateID}</h1>
        <ConfirmButton
          label="Delete template"
          confirm="Confirm delete"
          disabled={busy !== undefined}
          onConfirm={() =>
            void run("Delete", async () => {
              await api.deleteTemplate(template.templateID);
              navigate("/templates");
              return `Deleted ${name}`;
            })
          }
        />
      </header>
      <OutcomeBar outcome={outcome} />
      <h2>Tags</h2>
      <div class="toolbar">
        {tags.map((t) => (
          <span class="chip" key={t.tag}>
            {t.tag}
            {t.tag !== "default" ? (
              <button
                type="button"
                class="chip-x"
                aria-label={`Remove tag ${t.tag}`}
                onClick={() =>
                  void run("Remove tag", async () => {
                    await api.removeTags(name, [t.tag]);
                    reload();
                    return `Removed tag ${t.tag}`;
                  })
                }
              >
                ×
              </button>
            ) : null}
          </span>
        ))}
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            void run("Add tag", async () => {
              await api.addTags(`${name}:default`, [newTag.trim()]);
              setNewTag("");
              reload();
              return `Tagged the default build ${newTag.trim()}`;
            });
          }}
        >
          <input
            aria-label="New tag"
            placeholder="new tag"
            value={newTag}
            onInput={(e) => setNewTag(e.currentTarget.value)}
          />
          <button type="submit" disabled={!newTag.trim()}>
            Add tag
          </button>
        </form>
      </div>
      <h2>Builds</h2>
      {template.builds.length === 0 ? (
        <Empty title="No builds yet." />
      ) : (
        <div class="split">
          <ul class="list">
            {template.builds.map((b) => (
              <li key={b.buildID}>
                <button
                  type="button"
                  class="link"
                  aria-current={b.buildID === build?.buildID ? "true" : undefined}
                  onClick={() => setSelected(b.buildID)}
                >
                  <span class={`badge badge-${b.status}`}>{b.status}</span> {new Date(b.createdAt).toLocaleString()}
                </button>
              </li>
            ))}
          </ul>
          {build ? (
            <BuildLog
              api={api}
              templateId={template.templateID}
              buildId={build.buildID}
              finished={build.status === "ready" || build.status === "error"}
            />
          ) : null}
        </div>
      )}
    </section>
  );
}
