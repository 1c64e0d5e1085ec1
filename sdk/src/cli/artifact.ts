import { writeFile } from "node:fs/promises";
import { type ArtifactFormat, type ArtifactInfo, Artifacts } from "../artifacts.js";
import type { ConnectionOpts } from "../config.js";
import { CliError, ExitCode } from "./errors.js";
import { type Output, table } from "./output.js";
import { humanBytes } from "./snapshot.js";

function artifactView(info: ArtifactInfo) {
  return { ...info, createdAt: info.createdAt.toISOString() };
}

function parseFormat(value: string | undefined): ArtifactFormat | undefined {
  if (value === undefined || value === "tar" || value === "zip") return value;
  throw new CliError(`--format must be tar or zip, got '${value}'`, undefined, ExitCode.usage);
}

/** `warren sandbox publish ID PATH`: freezes PATH of the sandbox into an artifact and prints its id. */
export async function publishArtifact(
  conn: ConnectionOpts,
  sandboxId: string,
  path: string,
  opts: { format?: string; out?: string },
  out: Output,
): Promise<number> {
  const format = parseFormat(opts.format);
  const artifacts = new Artifacts(conn, sandboxId);
  const spinner = out.spinner(`publishing ${path} of ${sandboxId}`);
  let info: ArtifactInfo;
  try {
    info = await artifacts.publish(path, { ...(format ? { format } : {}), requestTimeoutMs: 0 });
    spinner.succeed(
      `artifact ${info.artifactId} (${info.format}, ${humanBytes(info.sizeBytes)}, sha256 ${info.sha256})`,
    );
  } catch (error) {
    spinner.fail(`could not publish ${path} of ${sandboxId}`);
    throw error;
  }
  if (opts.out) {
    await writeFile(opts.out, await artifacts.download(info.artifactId));
    out.note(`saved to ${opts.out}`);
  }
  // The id alone on stdout, so `ART=$(warren sandbox publish ID /out)` works.
  out.result(artifactView(info), () => info.artifactId);
  return ExitCode.ok;
}

export async function listArtifacts(conn: ConnectionOpts, opts: { sandbox?: string }, out: Output): Promise<number> {
  const all = await new Artifacts(conn, opts.sandbox).list();
  out.result(all.map(artifactView), () =>
    all.length === 0
      ? "no artifacts"
      : table([
          ["ARTIFACT ID", "SANDBOX", "PATH", "FORMAT", "SIZE", "CREATED"],
          ...all.map((a) => [
            a.artifactId,
            a.sandboxId,
            a.path,
            a.format,
            humanBytes(a.sizeBytes),
            a.createdAt.toISOString(),
          ]),
        ]),
  );
  return ExitCode.ok;
}

export async function artifactUrl(
  conn: ConnectionOpts,
  id: string,
  opts: { expires?: number },
  out: Output,
): Promise<number> {
  const signed = await new Artifacts(conn).downloadUrl(id, {
    ...(opts.expires !== undefined ? { expiresInSeconds: opts.expires } : {}),
  });
  out.result({ url: signed.url, expiresAt: signed.expiresAt.toISOString() }, () => signed.url);
  return ExitCode.ok;
}

export async function downloadArtifact(conn: ConnectionOpts, id: string, file: string, out: Output): Promise<number> {
  const bytes = await new Artifacts(conn).download(id);
  await writeFile(file, bytes);
  out.result(
    { artifactId: id, file, sizeBytes: bytes.byteLength },
    () => `saved ${humanBytes(bytes.byteLength)} to ${file}`,
  );
  return ExitCode.ok;
}

export async function deleteArtifacts(conn: ConnectionOpts, ids: string[], out: Output): Promise<number> {
  const artifacts = new Artifacts(conn);
  const results: { artifactId: string; deleted: boolean }[] = [];
  for (const id of ids) results.push({ artifactId: id, deleted: await artifacts.delete(id) });
  out.result(results.length === 1 ? results[0] : results, () =>
    results.map((r) => (r.deleted ? `deleted ${r.artifactId}` : `artifact ${r.artifactId} not found`)),
  );
  const missing = results.filter((r) => !r.deleted).map((r) => r.artifactId);
  if (missing.length > 0 && !out.json) {
    throw new CliError(
      `no artifact ${missing.join(", ")}`,
      "`warren artifact list` shows your team's artifacts",
      ExitCode.notFound,
    );
  }
  return missing.length > 0 ? ExitCode.notFound : ExitCode.ok;
}
