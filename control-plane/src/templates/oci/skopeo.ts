import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { ExecError, exec } from "../../runtime/exec.js";
import { ImageError } from "./errors.js";

export interface ImageCredentials {
  readonly username: string;
  readonly password: string;
}

export interface RegistrySession {
  /** `host[:port]` contacted. */
  readonly host: string;
  /** Served over plain HTTP (loopback test registries). */
  readonly insecure: boolean;
  readonly credentials?: ImageCredentials;
  /** Scratch directory (the caller removes it). */
  readonly dir: string;
  /** Absolute time (ms) after which everything fails with `timeout`. */
  readonly deadline: number;
  readonly timeoutMs: number;
  /** For messages: the image as the user named it. */
  readonly imageName: string;
}

/**
 * skopeo talks to registries for us: it speaks the distribution API with its token and basic-auth flows, Docker
 * and OCI manifests and lists, verifies every blob's digest and writes an OCI layout that umoci unpacks (both
 * are Debian packages; no Docker daemon). Each call runs with a private HOME/XDG dirs, an auth file of this pull
 * only and an accept-anything signature policy of its own, so nothing of the host's container config (its
 * logins in ~/.docker or /run/containers, its policy.json) takes part. Credentials go to that 0600 auth file, never
 * to argv (`--creds` shows in `ps`) or a message.
 */
export class Skopeo {
  private readonly authFile: string;
  private readonly policyFile: string;
  private readonly env: Record<string, string>;

  private constructor(private readonly session: RegistrySession) {
    this.authFile = join(session.dir, "auth.json");
    this.policyFile = join(session.dir, "policy.json");
    const home = join(session.dir, "home");
    this.env = {
      HOME: home,
      XDG_CONFIG_HOME: join(home, ".config"),
      XDG_RUNTIME_DIR: join(home, "run"),
      TMPDIR: join(session.dir, "tmp"),
    };
  }

  static async open(session: RegistrySession): Promise<Skopeo> {
    const skopeo = new Skopeo(session);
    for (const dir of [skopeo.env.HOME, skopeo.env.XDG_RUNTIME_DIR, skopeo.env.TMPDIR]) {
      await mkdir(dir as string, { recursive: true, mode: 0o700 });
    }
    const auths = session.credentials
      ? {
          [session.host]: {
            auth: Buffer.from(`${session.credentials.username}:${session.credentials.password}`).toString("base64"),
          },
        }
      : {};
    await writeFile(skopeo.authFile, JSON.stringify({ auths }), { mode: 0o600 });
    await writeFile(skopeo.policyFile, JSON.stringify({ default: [{ type: "insecureAcceptAnything" }] }));
    return skopeo;
  }

  /** `docker://host/repository` + `:tag` or `@digest`. */
  source(repository: string, reference: string): string {
    return `docker://${this.session.host}/${repository}${reference}`;
  }

  /** The manifest (or manifest list) exactly as the registry serves it. */
  async rawManifest(source: string): Promise<string> {
    const args = ["--policy", this.policyFile, "inspect", "--raw", "--authfile", this.authFile];
    args.push(`--tls-verify=${!this.session.insecure}`, source);
    return (await this.run(args)).stdout;
  }

  /** Copies one image (by digest) into an OCI layout directory as `layout:tag`. */
  async copyToLayout(
    source: string,
    layout: string,
    options: { recompress: boolean; onLine: (line: string) => void },
  ): Promise<void> {
    const args = ["--policy", this.policyFile, "copy", "--src-authfile", this.authFile];
    args.push(`--src-tls-verify=${!this.session.insecure}`, "--retry-times", "2");
    // umoci 0.4 unpacks gzip and plain layers only.
    if (options.recompress) args.push("--dest-compress", "--dest-compress-format", "gzip");
    args.push(source, `oci:${layout}`);
    await this.run(args, options.onLine);
  }

  private async run(args: string[], onLine?: (line: string) => void) {
    const remaining = this.session.deadline - Date.now();
    if (remaining <= 0) throw this.timeout();
    try {
      return await exec("skopeo", args, { env: this.env, timeoutMs: remaining, ...(onLine ? { onLine } : {}) });
    } catch (error) {
      if (Date.now() >= this.session.deadline - 50) throw this.timeout();
      if ((error as NodeJS.ErrnoException).code === "ENOENT") {
        throw new ImageError("failed", "skopeo is not installed on this node (Debian package skopeo)", {
          cause: error,
        });
      }
      if (error instanceof ExecError) throw this.classify(error.result.stderr);
      throw error;
    }
  }

  private timeout(): ImageError {
    return new ImageError(
      "timeout",
      `pulling image '${this.session.imageName}' from ${this.session.host} took longer than ${this.session.timeoutMs} ms`,
    );
  }

  /** skopeo's message (`level=fatal msg="..."`) as a typed error naming the image and the registry. */
  private classify(stderr: string): ImageError {
    const { host, imageName, credentials } = this.session;
    const fatal = /level=fatal msg="((?:[^"\\]|\\.)*)"/.exec(stderr)?.[1]?.replace(/\\"/g, '"');
    const reason = (fatal ?? stderr.trim().split("\n").pop() ?? "").replace(/^Error parsing image name "[^"]*": /, "");
    if (/manifest unknown|name unknown|not found/i.test(reason)) {
      return new ImageError("not_found", `image '${imageName}' not found in registry ${host}`);
    }
    if (/unauthorized|authentication required|denied|forbidden/i.test(reason)) {
      const why = credentials ? "the credentials were rejected" : "it needs credentials, or the image does not exist";
      return new ImageError("unauthorized", `registry ${host} refused image '${imageName}': unauthorized (${why})`);
    }
    if (
      /connection refused|no such host|i\/o timeout|network is unreachable|HTTP response to HTTPS|x509|tls:/i.test(
        reason,
      )
    ) {
      return new ImageError("failed", `cannot reach registry ${host} for image '${imageName}': ${reason}`);
    }
    return new ImageError("failed", `pulling image '${imageName}' from ${host} failed: ${reason.slice(0, 500)}`);
  }
}
