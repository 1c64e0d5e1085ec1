import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";

export interface LoopbackRegistry {
  readonly host: string;
  readonly process: ChildProcess;
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** How the registry asks for credentials: an htpasswd file (bcrypt: `htpasswd -Bbn`), or Docker's token flow. */
export type RegistryAuth =
  | { readonly htpasswd: string }
  | {
      readonly token: {
        readonly realm: string;
        readonly service: string;
        readonly issuer: string;
        readonly rootCertBundle: string;
      };
    };

/**
 * Debian's docker-registry (the CNCF distribution registry) on a loopback port, storing under `dir`, optionally
 * behind an htpasswd file (a path) or any `RegistryAuth`. The caller kills `process`.
 */
export async function startLoopbackRegistry(dir: string, access?: string | RegistryAuth): Promise<LoopbackRegistry> {
  const port = await freePort();
  mkdirSync(dir, { recursive: true });
  const scheme = typeof access === "string" ? { htpasswd: access } : access;
  const auth = !scheme
    ? ""
    : "htpasswd" in scheme
      ? `auth:\n  htpasswd:\n    realm: warren-test\n    path: ${scheme.htpasswd}\n`
      : `auth:\n  token:\n    realm: ${scheme.token.realm}\n    service: ${scheme.token.service}\n    issuer: ${scheme.token.issuer}\n    rootcertbundle: ${scheme.token.rootCertBundle}\n`;
  writeFileSync(
    join(dir, "config.yml"),
    `version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/storage\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:${port}\n  secret: test\n${auth}`,
  );
  const child = spawn("docker-registry", ["serve", join(dir, "config.yml")], { stdio: "ignore" });
  const host = `127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    const status = await fetch(`http://${host}/v2/`).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200 || status === 401) return { host, process: child };
    if (i > 100) throw new Error(`the registry in ${dir} did not start on ${host}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
