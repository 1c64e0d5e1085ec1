import { useEffect, useState } from "preact/hooks";

/** Everything the console shows lives under this path; the api answers index.html for any of it. */
export const BASE = "/console";

export function currentPath(): string {
  const path = location.pathname.startsWith(BASE) ? location.pathname.slice(BASE.length) : location.pathname;
  return path === "" ? "/" : path;
}

const listeners = new Set<() => void>();

export function navigate(path: string, replace = false): void {
  const url = BASE + path;
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  for (const listener of listeners) listener();
}

/** The console path (without /console), re-rendering on navigation and on back/forward. */
export function usePath(): string {
  const [path, setPath] = useState(currentPath());
  useEffect(() => {
    const update = () => setPath(currentPath());
    listeners.add(update);
    addEventListener("popstate", update);
    return () => {
      listeners.delete(update);
      removeEventListener("popstate", update);
    };
  }, []);
  return path;
}

/** Matches `/sandboxes/:id/:tab` style patterns; returns the named parts or undefined. */
export function match(pattern: string, path: string): Record<string, string> | undefined {
  const want = pattern.split("/").filter(Boolean);
  const have = path.split("/").filter(Boolean);
  const params: Record<string, string> = {};
  for (let i = 0; i < want.length; i++) {
    const part = want[i]!;
    const optional = part.endsWith("?");
    const value = have[i];
    if (value === undefined) {
      if (optional) continue;
      return undefined;
    }
    if (part.startsWith(":")) params[part.slice(1).replace(/\?$/, "")] = decodeURIComponent(value);
    else if (part !== value) return undefined;
  }
  return have.length <= want.length ? params : undefined;
}
