import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/**
 * The Debian mirror apt on this host already uses for `suite` (one-line `deb` entries or deb822 `.sources`
 * stanzas), so template builds fetch from the same place as the host's own packages.
 */
export function hostDebianMirror(suite: string, aptDir = "/etc/apt"): string | undefined {
  const files: string[] = [];
  if (existsSync(join(aptDir, "sources.list"))) files.push(join(aptDir, "sources.list"));
  const dir = join(aptDir, "sources.list.d");
  if (existsSync(dir)) for (const name of readdirSync(dir).sort()) files.push(join(dir, name));
  for (const file of files) {
    const text = readFileSync(file, "utf8");
    if (file.endsWith(".sources")) {
      for (const stanza of text.split(/\n\s*\n/)) {
        const field = (name: string) =>
          new RegExp(`^${name}:\\s*(.+)$`, "mi").exec(stanza)?.[1]?.trim().split(/\s+/) ?? [];
        if (!field("Types").includes("deb") || !field("Suites").includes(suite)) continue;
        const uri = field("URIs")[0];
        if (uri && !uri.includes("security")) return uri.replace(/\/$/, "");
      }
    } else if (file.endsWith(".list")) {
      for (const line of text.split("\n")) {
        const match = /^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)/.exec(line);
        if (match?.[2] === suite && !match[1]!.includes("security")) return match[1]!.replace(/\/$/, "");
      }
    }
  }
  return undefined;
}
