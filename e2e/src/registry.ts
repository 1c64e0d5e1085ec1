import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { freePort, type ManagedChild, startChild, waitFor } from "@warren/local/services";

/**
 * A private OCI registry on loopback: Debian's `docker-registry` (the CNCF distribution registry), storing under
 * `dir`. The template store of multi-node tests, and the source of images they build templates from.
 */
export async function startRegistry(
  dir: string,
  auth?: { readonly username: string; readonly password: string },
): Promise<{ host: string; process: ManagedChild }> {
  const port = await freePort();
  const storage = join(dir, "storage");
  mkdirSync(storage, { recursive: true });
  const config = join(dir, "config.yml");
  const htpasswd = join(dir, "htpasswd");
  if (auth) {
    // bcrypt, the only scheme the registry accepts (apache2-utils' htpasswd -B).
    const { execFileSync } = await import("node:child_process");
    writeFileSync(htpasswd, execFileSync("htpasswd", ["-Bbn", auth.username, auth.password]));
  }
  writeFileSync(
    config,
    [
      "version: 0.1",
      "log:",
      "  level: warn",
      "storage:",
      "  filesystem:",
      `    rootdirectory: ${storage}`,
      "  delete:",
      "    enabled: true",
      "http:",
      `  addr: 127.0.0.1:${port}`,
      ...(auth ? ["auth:", "  htpasswd:", "    realm: warren-test", `    path: ${htpasswd}`] : []),
      "",
    ].join("\n"),
  );
  const registry = startChild("registry", "docker-registry", ["serve", config], { logDir: join(dir, "logs") });
  const host = `127.0.0.1:${port}`;
  await waitFor(
    "the registry",
    async () => {
      const status = (await fetch(`http://${host}/v2/`).catch(() => undefined))?.status;
      return status === 200 || status === 401 ? true : undefined;
    },
    15_000,
  );
  return { host, process: registry };
}

/**
 * Makes a small image without Docker — busybox (static) as its shell and tools, a file, an environment variable
 * in its config — and pushes it to `dest` (`host:port/repo:tag`) with skopeo.
 */
export async function pushBusyboxImage(
  workDir: string,
  dest: string,
  auth?: { readonly username: string; readonly password: string },
): Promise<void> {
  const { chmodSync, copyFileSync, symlinkSync } = await import("node:fs");
  const root = join(workDir, "rootfs");
  mkdirSync(join(root, "bin"), { recursive: true });
  copyFileSync("/usr/bin/busybox", join(root, "bin/busybox"));
  chmodSync(join(root, "bin/busybox"), 0o755);
  for (const applet of ["sh", "ls", "cat", "id", "echo", "sleep", "mkdir", "rm", "mv", "ln", "chmod", "chown"]) {
    symlinkSync("busybox", join(root, "bin", applet));
  }
  mkdirSync(join(root, "etc"));
  writeFileSync(join(root, "etc/greeting"), "hello from the image\n");
  // An image's own node (a `node:22` image's), which stays the sandbox's `node` beside envd's.
  mkdirSync(join(root, "usr/local/bin"), { recursive: true });
  writeFileSync(join(root, "usr/local/bin/node"), '#!/bin/sh\necho "the image\'s own node $*"\n', { mode: 0o755 });
  mkdirSync(join(root, "tmp"));
  chmodSync(join(root, "tmp"), 0o1777);
  await pushRootfsImage(workDir, root, dest, {
    env: ["IMAGE_VAR=from-the-config", "PATH=/bin:/usr/bin"],
    ...(auth ? { auth } : {}),
  });
}

/**
 * Packs the directory `root` as a one-layer OCI image (umoci; owners kept as numbers) with `env` and `cmd` in its
 * config, and pushes it to `dest` (`host:port/repo:tag`) with skopeo. No Docker.
 */
export async function pushRootfsImage(
  workDir: string,
  root: string,
  dest: string,
  options: {
    readonly env?: readonly string[];
    readonly cmd?: readonly string[];
    readonly auth?: { readonly username: string; readonly password: string };
  } = {},
): Promise<void> {
  const { execFileSync } = await import("node:child_process");
  const layout = join(workDir, "layout");
  const env = { ...process.env, HOME: workDir };
  const run = (cmd: string, args: string[]) =>
    execFileSync(cmd, args, { env, stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 << 20 });
  run("umoci", ["init", "--layout", layout]);
  run("umoci", ["new", "--image", `${layout}:img`]);
  const tar = join(workDir, "layer.tar");
  run("tar", ["--numeric-owner", "-C", root, "-cf", tar, "."]);
  run("umoci", ["raw", "add-layer", "--image", `${layout}:img`, tar]);
  const config = [
    ...(options.env ?? []).flatMap((pair) => ["--config.env", pair]),
    ...(options.cmd ?? []).flatMap((arg) => ["--config.cmd", arg]),
  ];
  if (config.length > 0) run("umoci", ["config", "--image", `${layout}:img`, ...config]);
  const creds = options.auth ? ["--dest-creds", `${options.auth.username}:${options.auth.password}`] : [];
  run("skopeo", [
    "--insecure-policy",
    "copy",
    "--dest-tls-verify=false",
    ...creds,
    `oci:${layout}:img`,
    `docker://${dest}`,
  ]);
}
