import { existsSync } from "node:fs";
import { extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { ENVD_PORT } from "@warren/proto/ports";
import { type Request, type Response, Router } from "express";

/** The web console's settings (env vars, validated at start like the rest of the api's config). */
export interface ConsoleConfig {
  /** WARREN_CONSOLE_DIR: the built bundle (`npm run build` writes console/dist/public). */
  readonly dir: string;
  /**
   * WARREN_CONSOLE_SANDBOX_URL: how a browser reaches a sandbox port through the proxy, a URL whose first host
   * label holds `{port}` and `{sandboxID}` (e.g. `https://{port}-{sandboxID}.sandboxes.example.com`). Unset:
   * derived from an `api.<domain>` Host as `https://{port}-{sandboxID}.<domain>`, else the console has no files
   * or terminal.
   */
  readonly sandboxUrl: SandboxUrlTemplate | undefined;
}

export interface SandboxUrlTemplate {
  readonly template: string;
  /** The CSP source that covers every sandbox host the template makes (`https://*.example.com`). */
  readonly cspSource: string;
}

const DEFAULT_DIR = fileURLToPath(new URL("../../../console/dist/public", import.meta.url));

/** Checks a sandbox URL template once; the message names what is wrong with which value. */
export function parseSandboxUrlTemplate(raw: string): SandboxUrlTemplate {
  const problem = (why: string) => new Error(`WARREN_CONSOLE_SANDBOX_URL '${raw}' ${why}`);
  let url: URL;
  try {
    url = new URL(raw.replaceAll("{port}", String(ENVD_PORT)).replaceAll("{sandboxID}", "x"));
  } catch {
    throw problem("is not a URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw problem("must be http or https");
  if (url.pathname !== "/" || url.search || url.hash || url.username) throw problem("must be an origin only");
  const match = /^[a-z]+:\/\/([^/.:]*)\.([^/:]+)(:\d+)?\/?$/i.exec(raw);
  if (!match || !match[1]!.includes("{port}") || !match[1]!.includes("{sandboxID}")) {
    throw problem("must have {port} and {sandboxID} in its first host label, e.g. https://{port}-{sandboxID}.domain");
  }
  return { template: raw.replace(/\/$/, ""), cspSource: `${url.protocol}//*.${match[2]}${match[3] ?? ""}` };
}

export function loadConsoleConfig(env: NodeJS.ProcessEnv = process.env): ConsoleConfig {
  const raw = env.WARREN_CONSOLE_SANDBOX_URL ?? "";
  return {
    dir: resolve(env.WARREN_CONSOLE_DIR || DEFAULT_DIR),
    sandboxUrl: raw ? parseSandboxUrlTemplate(raw) : undefined,
  };
}

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".map": "application/json; charset=utf-8",
  ".html": "text/html; charset=utf-8",
  ".svg": "image/svg+xml",
  ".woff2": "font/woff2",
};

/** With the proxy in front (`api.<domain>`), sandboxes are `<port>-<id>.<domain>` on the same scheme E2B uses. */
function sandboxUrlFor(config: ConsoleConfig, req: Request): SandboxUrlTemplate | undefined {
  if (config.sandboxUrl) return config.sandboxUrl;
  const host = req.get("Host") ?? "";
  if (!/^api\.[a-z0-9.-]+(:\d+)?$/i.test(host)) return undefined;
  try {
    return parseSandboxUrlTemplate(`https://{port}-{sandboxID}.${host.slice(4)}`);
  } catch {
    return undefined;
  }
}

/**
 * Scripts and styles from this origin only; connections to this origin and to sandbox hosts. No remote origin
 * anywhere. Styles allow inline: xterm.js and the chart library size and color their elements at run time.
 */
function contentSecurityPolicy(sandbox: SandboxUrlTemplate | undefined): string {
  return [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self'",
    `connect-src 'self'${sandbox ? ` ${sandbox.cspSource}` : ""}`,
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ");
}

function commonHeaders(res: Response): void {
  res.setHeader("X-Content-Type-Options", "nosniff");
  res.setHeader("Referrer-Policy", "no-referrer");
}

/**
 * Warren extra: the web console at `/console` — the static bundle (content-hashed assets cached for a year,
 * index.html revalidated every time), its settings, and index.html for every other path under it (the console
 * routes in the browser).
 */
export function consoleRoutes(config: ConsoleConfig): Router {
  const router = Router();
  const index = join(config.dir, "index.html");

  router.get("/console/settings.json", (req, res) => {
    commonHeaders(res);
    res.setHeader("Cache-Control", "no-store");
    res.status(200).json({ sandboxUrl: sandboxUrlFor(config, req)?.template ?? null });
  });

  router.get("/console/assets/*file", (req, res) => {
    commonHeaders(res);
    const file = resolve(config.dir, "assets", ...(req.params as { file: string[] }).file);
    const type = CONTENT_TYPES[extname(file)];
    if (!file.startsWith(join(config.dir, "assets") + sep) || !type || !existsSync(file)) {
      res.status(404).type("text/plain").send(`no console asset ${req.path}\n`);
      return;
    }
    res.setHeader("Content-Type", type);
    res.setHeader("Cache-Control", "public, max-age=31536000, immutable");
    res.sendFile(file, { dotfiles: "deny", lastModified: false, etag: false });
  });

  router.get(["/console", "/console/*rest"], (req, res) => {
    commonHeaders(res);
    if (!existsSync(index)) {
      res.setHeader("Cache-Control", "no-store");
      res
        .status(503)
        .type("text/plain")
        .send("The web console is not built: run `npm run build` (or set WARREN_CONSOLE_DIR to a built bundle).\n");
      return;
    }
    res.setHeader("Content-Type", CONTENT_TYPES[".html"]!);
    res.setHeader("Cache-Control", "no-cache");
    res.setHeader("Content-Security-Policy", contentSecurityPolicy(sandboxUrlFor(config, req)));
    res.setHeader("X-Frame-Options", "DENY");
    res.setHeader("Cross-Origin-Opener-Policy", "same-origin");
    res.sendFile(index, { lastModified: false, etag: false });
  });
  return router;
}
