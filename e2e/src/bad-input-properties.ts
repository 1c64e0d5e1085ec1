import fc from "fast-check";

/**
 * Issue 18's bad-input classes as properties (fast-check): generated requests against the real api and envd (through
 * the proxy) of a running cluster. The property is the same for every generated input: the answer is never a server
 * error for what the client sent, and a client error carries a message. Generators lean on the inputs that broke
 * Warren before — NUL and other control characters, lone surrogates, deep nesting, out-of-range numbers and dates,
 * env var names outside POSIX, forged cursors, paths with `..`, `~` and odd bytes.
 */

export interface PropertyTarget {
  readonly apiUrl: string;
  readonly proxyUrl: string;
  readonly apiKey: string;
  readonly sandboxId: string;
  readonly envdAccessToken: string;
}

export interface Answer {
  readonly what: string;
  readonly status: number;
  readonly message: string;
  /** The whole answer body. */
  readonly text?: string;
}

/** Strings that stores and parsers have rejected: NUL, controls, lone surrogates, very long, JSON-looking. */
export const nastyString = fc.oneof(
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.constantFrom("\u0000", "a\u0000b", "\ud800", "\udfff x", "\u202e", "%00", "$(x)", "'; DROP TABLE teams;--", ""),
  fc.string({ minLength: 300, maxLength: 5000 }),
  fc.constantFrom("0", "-1", "1e309", "NaN", "null", "[]", "{}", "true"),
);

const nastyNumber = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.constantFrom(0, -1, 2 ** 31, 2 ** 53, Number.MAX_SAFE_INTEGER, 1e308, -1e308, 0.5),
);

export const anyJson: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 4, arbitrary: fc.jsonValue({ maxDepth: 3 }) },
  { weight: 1, arbitrary: nastyString },
  { weight: 1, arbitrary: nastyNumber },
);

/**
 * JSON nested far deeper than any sane document, spliced into a body as text: as a value it would overflow the
 * stack of whatever prints it (fast-check's own report included).
 */
export const deepField = fc.option(
  fc.record({
    field: fc.constantFrom("metadata", "envVars", "network", "unknownField"),
    depth: fc.integer({ min: 200, max: 20_000 }),
  }),
  { freq: 4 },
);

/** A create body as the text sent: the object, with one field replaced by deep nesting when `deep` says so. */
export function createBodyText(body: Record<string, unknown>, deep: { field: string; depth: number } | null): string {
  const text = JSON.stringify(body);
  if (!deep) return text;
  const { [deep.field]: _replaced, ...rest } = body;
  const nested = `${"[".repeat(deep.depth)}1${"]".repeat(deep.depth)}`;
  const others = JSON.stringify(rest).slice(1, -1);
  return `{"${deep.field}":${nested}${others ? `,${others}` : ""}}`;
}

/** A string as a URL can carry it: lone surrogates have no UTF-8 form, so they become U+FFFD as any client's would. */
export function urlSafe(text: string): string {
  return encodeURIComponent(
    text.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd"),
  );
}

const envName = fc.oneof(
  fc.constantFrom("", "=", "A=B", "1ABC", "WITH SPACE", "NUL\u0000", "é", "a".repeat(5000), "OK_NAME"),
  nastyString,
);

/** A create body: each field absent, well-formed or hostile. */
export const createBody = fc.record(
  {
    templateID: fc.oneof(fc.constant("base"), nastyString, anyJson),
    timeout: fc.oneof(nastyNumber, anyJson),
    metadata: fc.oneof(fc.dictionary(nastyString, nastyString, { maxKeys: 4 }), anyJson),
    envVars: fc.oneof(fc.dictionary(envName, nastyString, { maxKeys: 3 }), anyJson),
    secure: anyJson,
    autoPause: anyJson,
    allow_internet_access: anyJson,
    network: fc.oneof(
      fc.record({
        allowOut: fc.array(nastyString, { maxLength: 3 }),
        denyOut: fc.array(nastyString, { maxLength: 3 }),
      }),
      anyJson,
    ),
    volumeMounts: anyJson,
    mcp: anyJson,
    unknownField: anyJson,
  },
  { requiredKeys: [] },
);

/** Query strings of the list endpoints, cursors included (base64 of anything, as a forger would send). */
export const listQuery = fc.record(
  {
    metadata: nastyString,
    state: fc.oneof(fc.constantFrom("running", "paused", "running,paused", "dead"), nastyString),
    limit: fc.oneof(nastyNumber.map(String), nastyString),
    nextToken: fc.oneof(
      nastyString,
      fc.jsonValue().map((v) => Buffer.from(JSON.stringify(v)).toString("base64")),
      fc
        .record({ startedAt: fc.oneof(fc.integer(), nastyString), id: nastyString })
        .map((v) => Buffer.from(JSON.stringify(v)).toString("base64url")),
    ),
  },
  { requiredKeys: [] },
);

/** Paths a client might send envd, relative, `~`, `..`, odd bytes. */
export const sandboxPath = fc.oneof(
  fc.constantFrom("/", "~", "~/", "..", "/../../etc/passwd", "/proc/self/mem", "/dev/null", "/tmp/", "./x", ""),
  fc
    .array(fc.oneof(fc.constantFrom("..", ".", "tmp", "~", "home", "user"), nastyString), { maxLength: 6 })
    .map((parts) => `/${parts.join("/")}`),
  nastyString,
);

export const sandboxUser = fc.oneof(fc.constantFrom(undefined, "user", "root"), nastyString);

function messageOf(text: string): string {
  try {
    const parsed = JSON.parse(text) as { message?: unknown; error?: { message?: unknown } };
    if (typeof parsed.message === "string") return parsed.message;
    if (typeof parsed.error?.message === "string") return parsed.error.message;
  } catch {
    // not JSON
  }
  return text;
}

/** A request that can never fail on the client side (Undici refuses some header values: those are skipped). */
export async function send(what: string, url: string, init: RequestInit): Promise<Answer | undefined> {
  let res: Response;
  try {
    res = await fetch(url, { ...init, signal: AbortSignal.timeout(60_000) });
  } catch (error) {
    // Only inputs the client itself refuses to send (an invalid URL or header) end here.
    if (error instanceof TypeError && !/fetch failed/.test(error.message)) return undefined;
    throw error;
  }
  const text = await res.text();
  return { what, status: res.status, message: messageOf(text), text };
}

function envdHeaders(t: PropertyTarget, user: string | undefined): Record<string, string> {
  return {
    "E2b-Sandbox-Id": t.sandboxId,
    "E2b-Sandbox-Port": "49983",
    "X-Access-Token": t.envdAccessToken,
    ...(user !== undefined ? { Authorization: `Basic ${Buffer.from(`${user}:`).toString("base64")}` } : {}),
  };
}

/** The envd requests a property drives: read, write (small), stat, list, mkdir, start; never remove or move as root. */
export function envdRequest(
  t: PropertyTarget,
  kind: "read" | "write" | "stat" | "list" | "mkdir" | "start",
  path: string,
  user: string | undefined,
  extra: { cmd?: string; args?: string[]; envs?: Record<string, string> } = {},
): { what: string; url: string; init: RequestInit } {
  const headers = envdHeaders(t, user);
  const query = (p: string) => `path=${urlSafe(p)}${user ? `&username=${urlSafe(user)}` : ""}`;
  switch (kind) {
    case "read":
      return {
        what: `GET /files ${JSON.stringify(path)}`,
        url: `${t.proxyUrl}/files?${query(path)}`,
        init: { headers },
      };
    case "write": {
      const form = new FormData();
      form.append("file", new Blob(["fuzz"]), "f");
      return {
        what: `POST /files ${JSON.stringify(path)}`,
        url: `${t.proxyUrl}/files?${query(path)}`,
        init: { method: "POST", headers, body: form },
      };
    }
    case "start": {
      const message = JSON.stringify({
        process: { cmd: extra.cmd ?? "/bin/true", args: extra.args ?? [], envs: extra.envs ?? {}, cwd: path },
        stdin: false,
      });
      const body = Buffer.concat([Buffer.alloc(5), Buffer.from(message)]);
      body.writeUInt32BE(body.length - 5, 1);
      return {
        what: `Start ${JSON.stringify({ cmd: extra.cmd, cwd: path })}`,
        url: `${t.proxyUrl}/process.Process/Start`,
        init: { method: "POST", headers: { ...headers, "Content-Type": "application/connect+json" }, body },
      };
    }
    default: {
      const method = { stat: "Stat", list: "ListDir", mkdir: "MakeDir" }[kind];
      return {
        what: `${method} ${JSON.stringify(path)}`,
        url: `${t.proxyUrl}/filesystem.Filesystem/${method}`,
        init: {
          method: "POST",
          headers: { ...headers, "Content-Type": "application/json" },
          body: JSON.stringify(kind === "list" ? { path, depth: 1 } : { path }),
        },
      };
    }
  }
}

/**
 * What a streaming Connect answer (Start) says went wrong: its end-of-stream error's code, if any. A server error is
 * `internal`/`unknown` (or `unavailable`, `data_loss`); everything a client can cause has a code of its own.
 */
export async function startOutcome(
  url: string,
  init: RequestInit,
): Promise<{ status: number; code?: string } | undefined> {
  let res: Response;
  try {
    res = await fetch(url, { ...init, signal: AbortSignal.timeout(60_000) });
  } catch (error) {
    if (error instanceof TypeError && !/fetch failed/.test(error.message)) return undefined;
    throw error;
  }
  const bytes = Buffer.from(await res.arrayBuffer());
  if (res.status !== 200) return { status: res.status, code: messageOf(bytes.toString("utf8")) };
  let offset = 0;
  while (offset + 5 <= bytes.length) {
    const flags = bytes[offset] as number;
    const length = bytes.readUInt32BE(offset + 1);
    const payload = bytes.subarray(offset + 5, offset + 5 + length);
    offset += 5 + length;
    if (flags & 0x02) {
      const end = JSON.parse(payload.toString("utf8")) as { error?: { code?: string } };
      return { status: 200, ...(end.error?.code ? { code: end.error.code } : {}) };
    }
  }
  return { status: 200 };
}

export const SERVER_ERROR_CODES = new Set(["internal", "unknown", "data_loss", "unimplemented"]);
