import { ConnectError } from "@connectrpc/connect";
import { type EntryInfo, FileType } from "@warren/proto/filesystem/filesystem_pb";
import { useCallback, useEffect, useState } from "preact/hooks";
import type { EnvdConnection } from "../envd.js";
import { bytes, joinPath, parentPath } from "../format.js";
import { ConfirmButton, Empty, ErrorBox, Loading, messageOf, OutcomeBar, useAction } from "./common.js";

/** Files larger than this open as a download, not as text in the page. */
const MAX_TEXT_BYTES = 1024 * 1024;

function rpcMessage(error: unknown): string {
  return error instanceof ConnectError ? error.rawMessage : messageOf(error);
}

/** Hands a blob to the browser as a download (an object URL, never a URL carrying the token). */
function saveBlob(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export function FileBrowser(props: { envd: EnvdConnection }) {
  const { envd } = props;
  const [cwd, setCwd] = useState("/home/user");
  const [pathInput, setPathInput] = useState("/home/user");
  const [entries, setEntries] = useState<EntryInfo[]>();
  const [listError, setListError] = useState<unknown>();
  const [opened, setOpened] = useState<{ path: string; text: string }>();
  const [progress, setProgress] = useState<{ name: string; sent: number; total: number }>();
  const [folderName, setFolderName] = useState("");
  const [renaming, setRenaming] = useState<{ path: string; name: string }>();
  const { outcome, busy, run } = useAction();

  const list = useCallback(async () => {
    try {
      const res = await envd.filesystem.listDir({ path: cwd, depth: 1 });
      const sorted = [...res.entries].sort((a, b) =>
        a.type === b.type ? a.name.localeCompare(b.name) : a.type === FileType.DIRECTORY ? -1 : 1,
      );
      setEntries(sorted);
      setListError(undefined);
    } catch (error) {
      setEntries(undefined);
      setListError(new Error(rpcMessage(error)));
    }
  }, [envd, cwd]);

  useEffect(() => {
    setEntries(undefined);
    setPathInput(cwd);
    void list();
  }, [list, cwd]);

  const act = (label: string, action: () => Promise<string>) =>
    run(label, async () => {
      try {
        const text = await action();
        await list();
        return text;
      } catch (error) {
        throw new Error(rpcMessage(error));
      }
    });

  const open = (entry: EntryInfo) => {
    if (entry.type === FileType.DIRECTORY) {
      setOpened(undefined);
      setCwd(entry.path);
      return;
    }
    void run(`Open ${entry.name}`, async () => {
      if (entry.size > BigInt(MAX_TEXT_BYTES)) throw new Error(`${entry.name} is over 1 MiB: download it instead`);
      const blob = await envd.download(entry.path);
      setOpened({ path: entry.path, text: await blob.text() });
      return `Opened ${entry.path}`;
    });
  };

  const upload = (files: FileList | null) => {
    if (!files || files.length === 0) return;
    void act("Upload", async () => {
      const names: string[] = [];
      for (const file of Array.from(files)) {
        setProgress({ name: file.name, sent: 0, total: file.size });
        await envd.upload(joinPath(cwd, file.name), file, (sent, total) =>
          setProgress({ name: file.name, sent, total }),
        );
        names.push(file.name);
      }
      setProgress(undefined);
      return `Uploaded ${names.join(", ")} to ${cwd}`;
    }).finally(() => setProgress(undefined));
  };

  return (
    <div class="files">
      <div class="toolbar">
        <button type="button" onClick={() => setCwd(parentPath(cwd))} disabled={cwd === "/"} aria-label="Parent folder">
          ↑ Up
        </button>
        <form
          class="inline grow"
          onSubmit={(e) => {
            e.preventDefault();
            setCwd(pathInput.trim() || "/");
          }}
        >
          <input
            class="grow mono"
            aria-label="Folder path"
            value={pathInput}
            onInput={(e) => setPathInput(e.currentTarget.value)}
          />
          <button type="submit">Go</button>
        </form>
        <button type="button" onClick={() => void list()}>
          Refresh
        </button>
      </div>
      <div class="toolbar">
        <label class="button">
          Upload files
          <input
            type="file"
            multiple
            class="visually-hidden"
            data-testid="upload-input"
            onChange={(e) => {
              upload(e.currentTarget.files);
              e.currentTarget.value = "";
            }}
          />
        </label>
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            const name = folderName.trim();
            void act("Make folder", async () => {
              if (!name || name.includes("/")) throw new Error(`'${name}' is not a folder name`);
              await envd.filesystem.makeDir({ path: joinPath(cwd, name) });
              setFolderName("");
              return `Made folder ${joinPath(cwd, name)}`;
            });
          }}
        >
          <input
            placeholder="new folder"
            aria-label="New folder name"
            value={folderName}
            onInput={(e) => setFolderName(e.currentTarget.value)}
          />
          <button type="submit" disabled={!folderName.trim()}>
            Make folder
          </button>
        </form>
        {progress ? (
          <output class="progress">
            {progress.name}: <progress max={progress.total || 1} value={progress.sent} /> {bytes(progress.sent)} /{" "}
            {bytes(progress.total)}
          </output>
        ) : null}
      </div>
      <OutcomeBar outcome={outcome} />
      {listError ? (
        <ErrorBox error={listError} retry={() => void list()} />
      ) : !entries ? (
        <Loading what={cwd} />
      ) : entries.length === 0 ? (
        <Empty title={`${cwd} is empty.`}>Upload a file or make a folder.</Empty>
      ) : (
        <table class="table" data-testid="file-table">
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Size</th>
              <th scope="col">Owner</th>
              <th scope="col">Permissions</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {entries.map((entry) => (
              <tr key={entry.path} data-file={entry.name}>
                <td>
                  {renaming?.path === entry.path ? (
                    <form
                      class="inline"
                      onSubmit={(e) => {
                        e.preventDefault();
                        const target = joinPath(parentPath(entry.path), renaming.name.trim());
                        void act("Rename", async () => {
                          if (!renaming.name.trim() || renaming.name.includes("/")) {
                            throw new Error(`'${renaming.name}' is not a file name`);
                          }
                          await envd.filesystem.move({ source: entry.path, destination: target });
                          setRenaming(undefined);
                          return `Renamed ${entry.name} to ${renaming.name.trim()}`;
                        });
                      }}
                    >
                      <input
                        aria-label={`New name for ${entry.name}`}
                        value={renaming.name}
                        onInput={(e) => setRenaming({ path: entry.path, name: e.currentTarget.value })}
                        onKeyDown={(e) => e.key === "Escape" && setRenaming(undefined)}
                      />
                      <button type="submit">Save</button>
                    </form>
                  ) : (
                    <button type="button" class="link" onClick={() => open(entry)}>
                      {entry.type === FileType.DIRECTORY ? "📁 " : ""}
                      {entry.name}
                    </button>
                  )}
                </td>
                <td>{entry.type === FileType.DIRECTORY ? "—" : bytes(Number(entry.size))}</td>
                <td>{entry.owner}</td>
                <td class="mono">{entry.permissions}</td>
                <td class="actions">
                  {entry.type !== FileType.DIRECTORY ? (
                    <button
                      type="button"
                      disabled={busy !== undefined}
                      onClick={() =>
                        void run(`Download ${entry.name}`, async () => {
                          saveBlob(await envd.download(entry.path), entry.name);
                          return `Downloaded ${entry.path}`;
                        })
                      }
                    >
                      Download
                    </button>
                  ) : null}
                  <button type="button" onClick={() => setRenaming({ path: entry.path, name: entry.name })}>
                    Rename
                  </button>
                  <ConfirmButton
                    label="Delete"
                    confirm="Confirm delete"
                    onConfirm={() =>
                      void act("Delete", async () => {
                        await envd.filesystem.remove({ path: entry.path });
                        if (opened?.path === entry.path) setOpened(undefined);
                        return `Deleted ${entry.path}`;
                      })
                    }
                  />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {opened ? (
        <section class="viewer" aria-label={`Contents of ${opened.path}`}>
          <header>
            <strong class="mono">{opened.path}</strong>
            <button type="button" onClick={() => setOpened(undefined)}>
              Close
            </button>
          </header>
          <pre data-testid="file-viewer">{opened.text}</pre>
        </section>
      ) : null}
    </div>
  );
}
