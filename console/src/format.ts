/** "3m 20s", "2h 5m", "4d 1h": a duration short enough for a table cell. */
export function shortDuration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

export function bytes(n: number): string {
  if (!Number.isFinite(n)) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

export function clockTime(iso: string): string {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString([], { hour12: false });
}

/** A path joined under a folder, POSIX style. */
export function joinPath(dir: string, name: string): string {
  return dir.endsWith("/") ? `${dir}${name}` : `${dir}/${name}`;
}

/** The parent folder of a POSIX path ("/" stays "/"). */
export function parentPath(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const slash = trimmed.lastIndexOf("/");
  return slash <= 0 ? "/" : trimmed.slice(0, slash);
}

/** Does a sandbox match the free-text search (id, template, alias, node, metadata keys and values)? */
export function matchesSearch(
  sandbox: {
    sandboxID: string;
    templateID: string;
    alias?: string;
    nodeID?: string | null;
    metadata: Record<string, string>;
  },
  query: string,
): boolean {
  const q = query.trim().toLowerCase();
  if (!q) return true;
  const haystack = [
    sandbox.sandboxID,
    sandbox.templateID,
    sandbox.alias ?? "",
    sandbox.nodeID ?? "",
    ...Object.entries(sandbox.metadata ?? {}).map(([k, v]) => `${k}=${v}`),
  ];
  return q.split(/\s+/).every((term) => haystack.some((h) => h.toLowerCase().includes(term)));
}
