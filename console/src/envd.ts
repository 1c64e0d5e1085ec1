import { type Client, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { Process } from "@warren/proto/process/process_pb";

/** envd's port in every sandbox (E2B-PROTOCOL.md). */
export const ENVD_PORT = 49983;

/** Request header (Warren extra): replay a process's held output from this byte offset before live output. */
export const REPLAY_FROM_HEADER = "Warren-Replay-From";

/** Where a sandbox port answers through the proxy: the api's `{port}`/`{sandboxID}` URL template filled in. */
export function sandboxPortUrl(template: string, sandboxId: string, port: number): string {
  return template.replaceAll("{port}", String(port)).replaceAll("{sandboxID}", sandboxId).replace(/\/+$/, "");
}

/**
 * A signed-in view of one sandbox's envd, through the proxy's host routing (`<port>-<id>.<domain>`), as the e2b
 * SDK reaches it from a browser. The access token travels in a header, never in a URL.
 */
export class EnvdConnection {
  readonly process: Client<typeof Process>;
  readonly filesystem: Client<typeof Filesystem>;

  constructor(
    readonly baseUrl: string,
    private readonly accessToken: string,
  ) {
    const token: Interceptor = (next) => (req) => {
      req.header.set("X-Access-Token", accessToken);
      return next(req);
    };
    const transport = createConnectTransport({ baseUrl, interceptors: [token], useBinaryFormat: true });
    this.process = createClient(Process, transport);
    this.filesystem = createClient(Filesystem, transport);
  }

  private fileUrl(path: string): string {
    return `${this.baseUrl}/files?path=${encodeURIComponent(path)}`;
  }

  /** A file's bytes (envd's GET /files). */
  async download(path: string, signal?: AbortSignal): Promise<Blob> {
    const res = await fetch(this.fileUrl(path), {
      headers: { "X-Access-Token": this.accessToken },
      ...(signal ? { signal } : {}),
    });
    if (!res.ok) throw new Error(await envdMessage(res, `download of ${path}`));
    return res.blob();
  }

  /**
   * Writes a file (envd's multipart POST /files). XMLHttpRequest rather than fetch: only it reports upload
   * progress.
   */
  upload(path: string, file: Blob, onProgress: (sent: number, total: number) => void): Promise<void> {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", this.fileUrl(path));
      xhr.setRequestHeader("X-Access-Token", this.accessToken);
      xhr.upload.onprogress = (event) => onProgress(event.loaded, event.total || file.size);
      xhr.onload = () => {
        if (xhr.status >= 200 && xhr.status < 300) resolve();
        else reject(new Error(`upload of ${path} failed: ${messageOf(xhr.responseText) || `HTTP ${xhr.status}`}`));
      };
      xhr.onerror = () => reject(new Error(`upload of ${path} failed: the sandbox did not answer`));
      const form = new FormData();
      form.append("file", file, path.split("/").pop() || "file");
      xhr.send(form);
    });
  }
}

function messageOf(text: string): string {
  try {
    const parsed = JSON.parse(text) as { message?: unknown };
    if (typeof parsed.message === "string") return parsed.message;
  } catch {
    // Plain text.
  }
  return text.trim();
}

async function envdMessage(res: Response, what: string): Promise<string> {
  const text = await res.text().catch(() => "");
  return `${what} failed: ${messageOf(text) || `HTTP ${res.status}`}`;
}
