import { readFileSync } from "node:fs";
import { extname } from "node:path";

/** Go's built-in table (mime.builtinTypesLower), which wins over the system table as in Go. */
const BUILTIN: Readonly<Record<string, string>> = {
  ".avif": "image/avif",
  ".css": "text/css; charset=utf-8",
  ".gif": "image/gif",
  ".htm": "text/html; charset=utf-8",
  ".html": "text/html; charset=utf-8",
  ".jpeg": "image/jpeg",
  ".jpg": "image/jpeg",
  ".js": "text/javascript; charset=utf-8",
  ".json": "application/json",
  ".mjs": "text/javascript; charset=utf-8",
  ".pdf": "application/pdf",
  ".png": "image/png",
  ".svg": "image/svg+xml",
  ".wasm": "application/wasm",
  ".webp": "image/webp",
  ".xml": "text/xml; charset=utf-8",
};

let systemTypes: Map<string, string> | undefined;

/** /etc/mime.types (if the image has one), read once; text types get charset=utf-8 as Go adds it. */
function loadSystemTypes(file = "/etc/mime.types"): Map<string, string> {
  const types = new Map<string, string>();
  let text = "";
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return types;
  }
  for (const line of text.split("\n")) {
    const fields = line.replace(/#.*/, "").trim().split(/\s+/);
    const type = fields.shift();
    if (!type || fields.length === 0) continue;
    const value = type.startsWith("text/") ? `${type}; charset=utf-8` : type;
    for (const ext of fields) if (!types.has(`.${ext.toLowerCase()}`)) types.set(`.${ext.toLowerCase()}`, value);
  }
  return types;
}

/** The Content-Type for a file name by extension, if known. */
export function contentTypeByExtension(name: string): string | undefined {
  const ext = extname(name).toLowerCase();
  if (!ext) return undefined;
  const builtin = BUILTIN[ext];
  if (builtin) return builtin;
  systemTypes ??= loadSystemTypes();
  return systemTypes.get(ext);
}

/**
 * Go's http.DetectContentType in its simplest verdict: the first bytes of a file look like
 * text (no control bytes other than whitespace and ESC) or they do not.
 */
export function sniffContentType(head: Uint8Array): string {
  for (const byte of head) {
    const binary = byte <= 0x08 || byte === 0x0b || (byte >= 0x0e && byte <= 0x1a) || (byte >= 0x1c && byte <= 0x1f);
    if (binary) return "application/octet-stream";
  }
  return "text/plain; charset=utf-8";
}
