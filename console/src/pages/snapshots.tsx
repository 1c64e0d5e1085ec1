import { useEffect, useState } from "preact/hooks";
import type { LedgerEvent, SnapshotInfo, WarrenApi } from "../api.js";
import { ConfirmButton, Empty, ErrorBox, Link, Loading, OutcomeBar, useAction } from "../components/common.js";
import { bytes, shortDuration } from "../format.js";
import { ledgerTail } from "../live-sandboxes.js";
import { followEvents } from "../sse.js";
import { useNow } from "./sandboxes.js";

type Listing =
  | { readonly status: "loading" }
  | { readonly status: "error"; readonly error: unknown }
  | { readonly status: "ready"; readonly snapshots: SnapshotInfo[]; readonly nextToken: string | undefined };

/**
 * The team's snapshots, newest first. The team's ledger is followed (SSE): a snapshot taken anywhere (this
 * console, an SDK) re-reads the list, with no polling loop.
 */
export function SnapshotsPage(props: { api: WarrenApi }) {
  const { api } = props;
  const [listing, setListing] = useState<Listing>({ status: "loading" });
  const [generation, setGeneration] = useState(0);
  const [live, setLive] = useState(false);
  const [created, setCreated] = useState<string>();
  const { outcome, busy, run } = useAction();
  const now = useNow();
  const reload = () => setGeneration((g) => g + 1);

  useEffect(() => {
    let stopped = false;
    let follow: { stop: () => void } | undefined;
    const load = async () => {
      try {
        const page = await api.listSnapshots();
        if (!stopped) setListing({ status: "ready", ...page });
      } catch (error) {
        if (!stopped) setListing({ status: "error", error });
      }
    };
    (async () => {
      try {
        // The tail first: a snapshot taken between it and the first read is read again, never missed.
        const tail = await ledgerTail(api);
        await load();
        if (stopped) return;
        follow = followEvents({
          credential: api.credential,
          path: "/warren/v1/events/stream",
          cursor: tail,
          onStatus: (s) => setLive(s === "live"),
          onEvent: (event) => {
            if ((JSON.parse(event.data) as LedgerEvent).type === "sandbox.snapshotted") void load();
          },
        });
      } catch (error) {
        if (!stopped) setListing({ status: "error", error });
      }
    })();
    return () => {
      stopped = true;
      follow?.stop();
    };
  }, [api, generation]);

  const loadMore = (nextToken: string) =>
    run("Load more", async () => {
      const page = await api.listSnapshots(nextToken);
      setListing((current) =>
        current.status === "ready"
          ? { status: "ready", snapshots: [...current.snapshots, ...page.snapshots], nextToken: page.nextToken }
          : current,
      );
      return `Loaded ${page.snapshots.length} more snapshots`;
    });

  return (
    <section aria-labelledby="snapshots-title">
      <header class="page-header">
        <h1 id="snapshots-title">Snapshots</h1>
        <span class={`live live-${live ? "live" : "connecting"}`} data-testid="snapshots-live">
          {live ? "Live" : "Connecting…"}
        </span>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </header>
      <p class="hint">
        Take one from a sandbox's page (Snapshot) or with an SDK (<code>sandbox.createSnapshot()</code>). A snapshot is
        used like a template: every sandbox created from it starts with its files (and, when memory was kept, its
        running processes).
      </p>
      <OutcomeBar outcome={outcome} />
      {created ? (
        <p class="hint" data-testid="snapshot-created-sandbox">
          Open <Link href={`/sandboxes/${created}`}>{created}</Link>
        </p>
      ) : null}
      {listing.status === "loading" ? (
        <Loading what="snapshots" />
      ) : listing.status === "error" ? (
        <ErrorBox error={listing.error} retry={reload} />
      ) : listing.snapshots.length === 0 ? (
        <Empty title="This team has no snapshots.">
          Snapshot a running or paused sandbox from its page: it appears here as soon as it is taken.
        </Empty>
      ) : (
        <>
          <table class="table" data-testid="snapshot-table">
            <thead>
              <tr>
                <th scope="col">Snapshot</th>
                <th scope="col">Source sandbox</th>
                <th scope="col">Taken</th>
                <th scope="col">Contents</th>
                <th scope="col">Size</th>
                <th scope="col">Actions</th>
              </tr>
            </thead>
            <tbody>
              {listing.snapshots.map((s) => (
                <tr key={s.snapshotID} data-snapshot-id={s.snapshotID}>
                  <td class="mono">{s.snapshotID}</td>
                  <td>
                    <Link href={`/sandboxes/${s.sandboxID}`} class="mono">
                      {s.sandboxID}
                    </Link>
                  </td>
                  <td>
                    <time dateTime={s.createdAt} title={new Date(s.createdAt).toLocaleString()}>
                      {shortDuration(now - new Date(s.createdAt).getTime())} ago
                    </time>
                  </td>
                  <td>{s.memory === false ? "files only" : "files and memory"}</td>
                  <td>{s.sizeBytes !== undefined ? bytes(s.sizeBytes) : "-"}</td>
                  <td>
                    <div class="actions">
                      <button
                        type="button"
                        disabled={busy !== undefined}
                        onClick={() =>
                          void run(`Create from ${s.snapshotID}`, async () => {
                            setCreated(undefined);
                            const sandbox = await api.createSandbox(s.snapshotID, 300, {});
                            setCreated(sandbox.sandboxID);
                            return `Created sandbox ${sandbox.sandboxID} from ${s.snapshotID}`;
                          })
                        }
                      >
                        {busy === `Create from ${s.snapshotID}` ? "Creating…" : "Create sandbox"}
                      </button>
                      <ConfirmButton
                        label="Delete"
                        confirm="Confirm delete"
                        disabled={busy !== undefined}
                        onConfirm={() =>
                          void run("Delete snapshot", async () => {
                            await api.deleteSnapshot(s.snapshotID);
                            setListing((current) =>
                              current.status === "ready"
                                ? {
                                    ...current,
                                    snapshots: current.snapshots.filter((x) => x.snapshotID !== s.snapshotID),
                                  }
                                : current,
                            );
                            return `Deleted snapshot ${s.snapshotID}`;
                          })
                        }
                      />
                    </div>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {listing.nextToken ? (
            <button type="button" disabled={busy !== undefined} onClick={() => void loadMore(listing.nextToken!)}>
              Load more
            </button>
          ) : null}
        </>
      )}
    </section>
  );
}
