import { createReadStream } from "node:fs";
import { request as httpRequest, type IncomingHttpHeaders, type IncomingMessage } from "node:http";
import { request as httpsRequest } from "node:https";
import { AgentError } from "./errors.js";

/**
 * The few calls of the OCI distribution API that chunked snapshot parts need (chunked-images.ts's registry
 * side): whether a blob is there, a monolithic blob upload, a manifest put and get, a blob get. skopeo moves
 * everything else; it is not used for chunks because its cost per layer grows with the square of the layer count
 * (1000 layers took 34 s here). Authentication as registries ask for it: HTTP basic, or a bearer token from the
 * realm the registry names (Docker's token flow), with the store's credentials. Credentials and tokens never
 * appear in an error message.
 */
export interface RegistryClientOptions {
  /** `host[:port]`. */
  readonly host: string;
  readonly repo: string;
  /** Plain HTTP, or HTTPS without checking the certificate (skopeo's `--tls-verify=false`). */
  readonly insecure: boolean;
  readonly username?: string;
  readonly password?: string;
}

/** A request body: bytes, or a file of the node's streamed from disk (a pack). */
type Body = Buffer | { readonly file: string; readonly size: number };

interface Answer {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly body: Buffer;
}

const TIMEOUT_MS = 5 * 60_000;
const USER_AGENT = "warren-node-agent";

export class RegistryClient {
  /** https, or (insecure) whichever the registry answered on first. */
  private scheme: "https" | "http" | undefined;
  private authorization: string | undefined;

  constructor(private readonly options: RegistryClientOptions) {
    if (!options.insecure) this.scheme = "https";
  }

  private get basic(): string | undefined {
    const { username, password } = this.options;
    return username ? `Basic ${Buffer.from(`${username}:${password ?? ""}`).toString("base64")}` : undefined;
  }

  async hasBlob(digest: string): Promise<boolean> {
    const answer = await this.call("HEAD", `blobs/${digest}`);
    if (answer.status === 200) return true;
    if (answer.status === 404) return false;
    throw this.failed("HEAD", `blobs/${digest}`, answer);
  }

  /** Uploads a blob in one request after opening the upload (every registry takes POST then PUT). */
  async putBlob(digest: string, data: Body): Promise<void> {
    const opened = await this.call("POST", "blobs/uploads/", { "content-length": "0" });
    const location = opened.headers.location;
    if (opened.status !== 202 || !location) throw this.failed("POST", "blobs/uploads/", opened);
    const url = new URL(location, this.origin());
    url.searchParams.set("digest", digest);
    const size = Buffer.isBuffer(data) ? data.length : data.size;
    const put = await this.callUrl("PUT", url, data, {
      "content-type": "application/octet-stream",
      "content-length": String(size),
    });
    if (put.status !== 201) throw this.failed("PUT", "blobs/uploads/…", put);
  }

  async putManifest(tag: string, manifest: Buffer, mediaType: string): Promise<void> {
    const answer = await this.call("PUT", `manifests/${tag}`, { "content-type": mediaType }, manifest);
    if (answer.status !== 201) throw this.failed("PUT", `manifests/${tag}`, answer);
  }

  /** A manifest by tag (undefined when the registry does not have it). */
  async getManifest(tag: string, mediaType: string): Promise<Buffer | undefined> {
    const answer = await this.call("GET", `manifests/${tag}`, { accept: mediaType });
    if (answer.status === 404) return undefined;
    if (answer.status !== 200) throw this.failed("GET", `manifests/${tag}`, answer);
    return answer.body;
  }

  /** A blob as a stream (packs can be large), following a redirect to the registry's storage. */
  async getBlob(digest: string): Promise<AsyncIterable<Buffer>> {
    // A HEAD first settles the credentials (a 401 there costs nothing to repeat), so the GET streams at once.
    if (!(await this.hasBlob(digest))) throw new AgentError("not_found", `blob ${digest} is not in the store`);
    let url = new URL(`/v2/${this.options.repo}/blobs/${digest}`, this.origin());
    let headers: Record<string, string> = this.authorization ? { authorization: this.authorization } : {};
    for (let hop = 0; hop < 3; hop++) {
      const res = await this.open("GET", url, undefined, headers);
      const status = res.statusCode ?? 0;
      if (status === 200) return res;
      const chunks: Buffer[] = [];
      for await (const chunk of res) chunks.push(chunk as Buffer);
      const answer = { status, headers: res.headers, body: Buffer.concat(chunks) };
      if (![301, 302, 303, 307, 308].includes(status) || !res.headers.location) {
        throw this.failed("GET", `blobs/${digest}`, answer);
      }
      url = new URL(res.headers.location, url);
      // A signed storage URL carries its own authorization.
      headers = {};
    }
    throw new AgentError("internal", `the store's registry redirected GET blobs/${digest} too many times`);
  }

  private origin(): string {
    return `${this.scheme ?? "https"}://${this.options.host}`;
  }

  private async call(method: string, path: string, headers: Record<string, string> = {}, body?: Body): Promise<Answer> {
    if (!this.scheme) await this.pickScheme();
    return this.callUrl(method, new URL(`/v2/${this.options.repo}/${path}`, this.origin()), body, headers);
  }

  /**
   * Sends with the current credentials; on a 401, gets what the challenge asks for and sends once more. Calls run
   * concurrently: one that was sent before another got the credentials retries with them.
   */
  private async callUrl(method: string, url: URL, body?: Body, headers: Record<string, string> = {}): Promise<Answer> {
    const send = (authorization: string | undefined) =>
      this.send(method, url, body, { ...headers, ...(authorization ? { authorization } : {}) });
    const sentWith = this.authorization;
    const first = await send(sentWith);
    if (first.status !== 401) return first;
    if (this.authorization !== sentWith) return send(this.authorization);
    const challenge = String(first.headers["www-authenticate"] ?? "");
    if (/^basic/i.test(challenge) && this.basic && sentWith !== this.basic) {
      this.authorization = this.basic;
      return send(this.authorization);
    }
    if (/^bearer/i.test(challenge)) {
      this.authorization = await this.token(challenge);
      return send(this.authorization);
    }
    return first;
  }

  /** Docker's token flow: the realm named by the challenge, for this repository, pull and push. */
  private async token(challenge: string): Promise<string> {
    const params = Object.fromEntries(
      [...challenge.matchAll(/(\w+)="([^"]*)"/g)].map((match) => [match[1] as string, match[2] as string]),
    );
    if (!params.realm) throw new AgentError("internal", `the store's registry asked for a token without a realm`);
    const url = new URL(params.realm);
    if (params.service) url.searchParams.set("service", params.service);
    url.searchParams.set("scope", `repository:${this.options.repo}:pull,push`);
    const answer = await this.send("GET", url, undefined, this.basic ? { authorization: this.basic } : {});
    if (answer.status !== 200) throw this.failed("GET", "token", answer);
    const parsed = JSON.parse(answer.body.toString()) as { token?: string; access_token?: string };
    const token = parsed.token ?? parsed.access_token;
    if (!token) throw new AgentError("internal", "the store's registry answered its token request without a token");
    return `Bearer ${token}`;
  }

  /** An insecure registry: HTTPS without checking the certificate if it speaks it, else plain HTTP. */
  private async pickScheme(): Promise<void> {
    try {
      await this.send("GET", new URL(`https://${this.options.host}/v2/`));
      this.scheme = "https";
    } catch {
      this.scheme = "http";
    }
  }

  private async send(method: string, url: URL, body?: Body, headers: Record<string, string> = {}): Promise<Answer> {
    const res = await this.open(method, url, body, headers);
    const chunks: Buffer[] = [];
    for await (const chunk of res) chunks.push(chunk as Buffer);
    return { status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) };
  }

  /** One request; resolves with the response, its body not read yet. */
  private open(method: string, url: URL, body?: Body, headers: Record<string, string> = {}): Promise<IncomingMessage> {
    const request = url.protocol === "https:" ? httpsRequest : httpRequest;
    return new Promise((resolve, reject) => {
      const req = request(
        url,
        {
          method,
          // Named, so a registry's operator can tell Warren's requests in its logs.
          headers: { "user-agent": USER_AGENT, ...headers },
          timeout: TIMEOUT_MS,
          ...(url.protocol === "https:" && this.options.insecure ? { rejectUnauthorized: false } : {}),
        },
        resolve,
      );
      req.on("timeout", () => req.destroy(new Error(`no answer within ${TIMEOUT_MS} ms`)));
      req.on("error", reject);
      if (body === undefined || Buffer.isBuffer(body)) req.end(body);
      else {
        const file = createReadStream(body.file);
        file.on("error", (error) => req.destroy(error));
        file.pipe(req);
      }
    });
  }

  private failed(method: string, path: string, answer: Answer): AgentError {
    // The registry's own error body names the problem (never our credentials).
    const detail = answer.body.toString().slice(0, 300).trim();
    return new AgentError(
      "internal",
      `the store's registry answered ${method} ${path} with ${answer.status}${detail ? `: ${detail}` : ""}`,
    );
  }
}
