import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../src/node-agent/log.js";
import { NamespaceDriver } from "../src/runtime/namespace/driver.js";
import { ImageError } from "../src/templates/oci/errors.js";
import { type PulledImage, type PullImageOptions, pullImageRootfs } from "../src/templates/oci/pull.js";
import { type LoopbackRegistry, startLoopbackRegistry } from "./loopback-registry.js";
import { sdkSandbox } from "./node-agent-harness.js";

const run = promisify(execFile);
const REPO_ROOT = fileURLToPath(new URL("../..", import.meta.url));
const UID_BASE = 100000;
const USER = "alice";
const PASSWORD = `pw-${randomBytes(12).toString("hex")}`;
const SANDBOX = { instance: "oi", cidr: "10.210.40.0/24", stateDir: "/var/lib/warren/test-oi" };

/** Scratch of this file: registries' storage, image layouts, pulls. */
const tmp = mkdtempSync(join(tmpdir(), "warren-oci-image-"));
/** Prepared rootfs trees live where the node agent keeps templates (overlay lower dirs). */
const images = join(SANDBOX.stateDir, "images");
const toolEnv = { ...process.env, HOME: join(tmp, "home") };

type Registry = LoopbackRegistry;

let open: Registry;
let secured: Registry;
let mirror: Registry;
let busybox: { ref: string; digest: string };
let driver: NamespaceDriver;

interface ImageSettings {
  readonly env?: readonly string[];
  readonly user?: string;
  readonly workdir?: string;
  readonly entrypoint?: readonly string[];
  readonly cmd?: readonly string[];
}

/** An OCI layout `layout:tag` whose layers are the given directories, in order (umoci, no Docker). */
async function buildLayout(layout: string, tag: string, layers: readonly string[], settings: ImageSettings) {
  if (!existsSync(layout)) await run("umoci", ["init", "--layout", layout], { env: toolEnv });
  await run("umoci", ["new", "--image", `${layout}:${tag}`], { env: toolEnv });
  for (const [i, dir] of layers.entries()) {
    const tar = `${layout}-${tag}-${i}.tar`;
    await run("tar", ["--numeric-owner", "--xattrs", "-C", dir, "-cf", tar, "."]);
    await run("umoci", ["raw", "add-layer", "--image", `${layout}:${tag}`, tar], { env: toolEnv });
  }
  const args = ["config", "--image", `${layout}:${tag}`];
  for (const e of settings.env ?? []) args.push("--config.env", e);
  if (settings.user) args.push("--config.user", settings.user);
  if (settings.workdir) args.push("--config.workingdir", settings.workdir);
  for (const e of settings.entrypoint ?? []) args.push("--config.entrypoint", e);
  for (const c of settings.cmd ?? []) args.push("--config.cmd", c);
  await run("umoci", args, { env: toolEnv });
}

async function push(source: string, dest: string, authfile?: string, extra: readonly string[] = []): Promise<void> {
  const args = ["copy", "--dest-tls-verify=false", ...(authfile ? ["--dest-authfile", authfile] : []), ...extra];
  await run("skopeo", [...args, source, `docker://${dest}`], { env: toolEnv });
}

async function digestOf(host: string, repoAndTag: string, authfile?: string): Promise<string> {
  const args = ["inspect", "--tls-verify=false", ...(authfile ? ["--authfile", authfile] : [])];
  const { stdout } = await run("skopeo", [...args, "--format", "{{.Digest}}", `docker://${host}/${repoAndTag}`], {
    env: toolEnv,
  });
  return stdout.trim();
}

/** Two layers like a Dockerfile's: busybox + files, then a layer that changes and deletes some (a whiteout). */
function busyboxLayers(): string[] {
  const base = join(tmp, "busybox-1");
  mkdirSync(join(base, "bin"), { recursive: true });
  copyFileSync("/usr/bin/busybox", join(base, "bin/busybox"));
  chmodSync(join(base, "bin/busybox"), 0o755);
  for (const applet of ["sh", "ls", "cat", "id", "whoami", "echo", "sleep", "stat"]) {
    symlinkSync("busybox", join(base, "bin", applet));
  }
  mkdirSync(join(base, "etc"));
  writeFileSync(join(base, "etc/greeting"), "old\n");
  writeFileSync(join(base, "etc/removed"), "gone in layer 2\n");
  mkdirSync(join(base, "work"));
  chownSync(join(base, "work"), 1000, 1000);
  const top = join(tmp, "busybox-2");
  mkdirSync(join(top, "etc"), { recursive: true });
  writeFileSync(join(top, "etc/greeting"), "hello from the image\n");
  writeFileSync(join(top, "etc/.wh.removed"), "");
  return [base, top];
}

/**
 * A Debian bookworm image made of the host's own Debian files (the host is bookworm): merged /usr, libc6 and
 * libstdc++6 with the loader behind /lib64's absolute symlink, bash, dash, some coreutils, util-linux's setpriv,
 * sudo with PAM, an ld.so.cache, and an `ubuntu` account holding uid 1000 as in Ubuntu 24.04's image. No tini:
 * Debian images do not have it.
 */
async function debianRoot(): Promise<string> {
  const root = join(tmp, "debian");
  const programs = ["bash", "dash", "ls", "cat", "id", "whoami", "env", "sleep", "stat", "sudo", "setpriv"];
  const files = new Set<string>([
    ...programs.map((p) => `/usr/bin/${p}`),
    ...readdirSync("/usr/libexec/sudo").map((f) => `/usr/libexec/sudo/${f}`),
    ...readdirSync("/usr/lib/x86_64-linux-gnu/security").map((f) => `/usr/lib/x86_64-linux-gnu/security/${f}`),
  ]);
  // What debian:bookworm has of them: all of libc6's libraries, and libstdc++ (apt links it).
  const { stdout: packaged } = await run("dpkg", ["-L", "libc6", "libstdc++6", "libgcc-s1"]);
  for (const path of packaged.split("\n")) if (/\/lib\/x86_64-linux-gnu\/[^/]+\.so[.\d]*$/.test(path)) files.add(path);
  const elves = [...files].filter((f) => lstatSync(f).isFile());
  const { stdout } = await run("ldd", elves).catch((e: { stdout: string }) => ({ stdout: e.stdout }));
  for (const match of stdout.matchAll(/(?:=> )?(\/\S+) \(0x/g)) files.add(match[1] as string);
  for (const path of [...files, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"]) {
    const real = realpathSync(path);
    mkdirSync(dirname(join(root, real)), { recursive: true });
    copyFileSync(real, join(root, real));
    chmodSync(join(root, real), statSync(real).mode & 0o7777);
    const canonical = path.replace(/^\/(bin|lib|lib64|sbin)\//, "/usr/$1/");
    if (canonical !== real && !existsSync(join(root, canonical))) {
      mkdirSync(dirname(join(root, canonical)), { recursive: true });
      symlinkSync(real, join(root, canonical));
    }
  }
  mkdirSync(join(root, "etc"));
  for (const dir of ["/etc/pam.d", "/etc/security", "/etc/skel"]) {
    await run("cp", ["-a", dir, join(root, dir)]);
  }
  for (const file of [
    "/etc/sudoers",
    "/etc/login.defs",
    "/etc/nsswitch.conf",
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/os-release",
  ]) {
    await run("cp", ["-aL", file, join(root, file)]);
  }
  symlinkSync("dash", join(root, "usr/bin/sh"));
  mkdirSync(join(root, "usr/lib64"), { recursive: true });
  rmSync(join(root, "usr/lib64/ld-linux-x86-64.so.2"), { force: true });
  symlinkSync("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", join(root, "usr/lib64/ld-linux-x86-64.so.2"));
  for (const dir of ["bin", "lib", "lib64", "sbin"]) symlinkSync(`usr/${dir}`, join(root, dir));
  writeFileSync(
    join(root, "etc/passwd"),
    "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nubuntu:x:1000:1000:Ubuntu:/home/ubuntu:/bin/bash\n",
  );
  writeFileSync(join(root, "etc/group"), "root:x:0:\nsudo:x:27:ubuntu\nnogroup:x:65534:\nubuntu:x:1000:\n");
  writeFileSync(
    join(root, "etc/shadow"),
    "root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\nubuntu:!:19000:0:99999:7:::\n",
    { mode: 0o640 },
  );
  writeFileSync(join(root, "etc/gshadow"), "root:*::\nsudo:*::ubuntu\nubuntu:!::\n", { mode: 0o640 });
  writeFileSync(join(root, "etc/greeting"), "hello from debian\n");
  for (const dir of ["tmp", "run", "var/tmp", "root", "home/ubuntu"]) mkdirSync(join(root, dir), { recursive: true });
  chmodSync(join(root, "tmp"), 0o1777);
  chownSync(join(root, "home/ubuntu"), 1000, 1000);
  await run("ldconfig", ["-r", root]);
  return root;
}

function pullOptions(overrides: Partial<PullImageOptions> & { ref: string }): PullImageOptions {
  const name = `p-${randomBytes(4).toString("hex")}`;
  return {
    workDir: join(tmp, "work", name),
    destRootfs: join(images, name),
    uidBase: UID_BASE,
    insecureRegistries: [open.host, secured.host, mirror.host],
    timeoutMs: 30_000,
    ...overrides,
  };
}

/** The pull's error, and proof that it left nothing behind (scratch, destination, staging sibling). */
async function failedPull(options: PullImageOptions): Promise<ImageError> {
  let caught: unknown;
  try {
    await pullImageRootfs(options);
  } catch (error) {
    caught = error;
  }
  expect(caught).toBeInstanceOf(ImageError);
  expect(existsSync(options.destRootfs)).toBe(false);
  expect(existsSync(options.workDir) ? readdirSync(options.workDir) : []).toEqual([]);
  const siblings = existsSync(images) ? readdirSync(images) : [];
  expect(siblings.filter((name) => name.includes(options.destRootfs.split("/").pop() as string))).toEqual([]);
  return caught as ImageError;
}

/** Starts a sandbox from a prepared rootfs with the namespace driver, as the node agent would. */
async function withSandbox(
  id: string,
  rootfs: string,
  pulled: PulledImage,
  body: (sandbox: ReturnType<typeof sdkSandbox>) => Promise<void>,
): Promise<void> {
  const instance = await driver.create({
    template: { templateId: id, hash: pulled.digest.slice(7, 23), rootfs, allowSetuid: pulled.prepared.user.sudo },
    resources: { cpuCount: 1, memoryMB: 256, diskSizeMB: 128, pidsMax: 256 },
  });
  try {
    await body(sdkSandbox(id, instance.envdUrl));
  } finally {
    await driver.kill(instance.instanceId);
  }
}

beforeAll(async () => {
  mkdirSync(toolEnv.HOME, { recursive: true });
  mkdirSync(images, { recursive: true });
  const htpasswd = join(tmp, "htpasswd");
  const { stdout } = await new Promise<{ stdout: string }>((resolve, reject) => {
    const child = execFile("htpasswd", ["-Bin", USER], (error, out) =>
      error ? reject(error) : resolve({ stdout: out }),
    );
    child.stdin?.end(PASSWORD);
  });
  writeFileSync(htpasswd, stdout);
  [open, secured, mirror] = await Promise.all([
    startLoopbackRegistry(join(tmp, "registry-open")),
    startLoopbackRegistry(join(tmp, "registry-secured"), htpasswd),
    startLoopbackRegistry(join(tmp, "registry-mirror")),
  ]);
  const layout = join(tmp, "layout");
  await buildLayout(layout, "busybox", busyboxLayers(), {
    env: ["FOO=bar", "PATH=/usr/local/bin:/usr/bin:/bin"],
    user: "1000:1000",
    workdir: "/work",
    entrypoint: ["/bin/sh", "-c"],
    cmd: ["echo hi"],
  });
  await buildLayout(layout, "debian", [await debianRoot()], { cmd: ["/bin/bash"] });
  const authfile = join(tmp, "push-auth.json");
  writeFileSync(
    authfile,
    JSON.stringify({ auths: { [secured.host]: { auth: Buffer.from(`${USER}:${PASSWORD}`).toString("base64") } } }),
  );
  await Promise.all([
    push(`oci:${layout}:busybox`, `${open.host}/team/busybox:v1`),
    push(`oci:${layout}:debian`, `${open.host}/team/debian:bookworm`),
    push(`oci:${layout}:busybox`, `${secured.host}/private/busybox:v1`, authfile),
    push(`oci:${layout}:busybox`, `${mirror.host}/library/busybox:1.35`),
  ]);
  await pushList(layout);
  // Recompressed into a layout of its own: skopeo reuses the gzip blobs wherever they already are.
  await run(
    "skopeo",
    [
      "copy",
      "--dest-compress",
      "--dest-compress-format",
      "zstd",
      `oci:${layout}:busybox`,
      `oci:${layout}-zstd:busybox`,
    ],
    {
      env: toolEnv,
    },
  );
  await push(`oci:${layout}-zstd:busybox`, `${open.host}/team/busybox:zstd`);
  busybox = { ref: `${open.host}/team/busybox:v1`, digest: await digestOf(open.host, "team/busybox:v1") };
  driver = new NamespaceDriver({
    stateDir: SANDBOX.stateDir,
    instance: SANDBOX.instance,
    netCidr: SANDBOX.cidr,
    netPoolSize: 0,
    uidBase: UID_BASE,
    nodeBinary: process.execPath,
    envdRoot: REPO_ROOT,
    readyTimeoutMs: 20_000,
    log: silentLogger,
    dnsUpstream: "127.0.0.1:9",
    uplinkForwarding: false,
  });
  await driver.start();
  const { adopted } = await driver.reconcile();
  for (const instance of adopted) await driver.kill(instance.instanceId);
}, 60_000);

/** A manifest list (OCI index) with this host's platform and another, and one without this host's platform. */
async function pushList(layout: string): Promise<void> {
  const indexPath = join(layout, "index.json");
  const index = JSON.parse(readFileSync(indexPath, "utf8")) as {
    manifests: { digest: string; size: number; mediaType: string; annotations?: Record<string, string> }[];
  };
  const image = index.manifests.find((m) => m.annotations?.["org.opencontainers.image.ref.name"] === "busybox");
  if (!image) throw new Error("no busybox manifest in the layout");
  const entry = (architecture: string) => ({
    mediaType: image.mediaType,
    digest: image.digest,
    size: image.size,
    platform: { os: "linux", architecture },
  });
  const here = process.arch === "x64" ? "amd64" : "arm64";
  const lists = { multi: [entry("s390x"), entry(here)], foreign: [entry("s390x"), entry("riscv64")] };
  for (const [tag, manifests] of Object.entries(lists)) {
    const blob = JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests });
    const digest = createHash("sha256").update(blob).digest("hex");
    writeFileSync(join(layout, "blobs/sha256", digest), blob);
    index.manifests.push({
      mediaType: "application/vnd.oci.image.index.v1+json",
      digest: `sha256:${digest}`,
      size: Buffer.byteLength(blob),
      annotations: { "org.opencontainers.image.ref.name": tag },
    });
  }
  writeFileSync(indexPath, JSON.stringify(index));
  await push(`oci:${layout}:multi`, `${open.host}/team/multi:v1`, undefined, ["--all"]);
  await push(`oci:${layout}:foreign`, `${open.host}/team/foreign:v1`, undefined, ["--all"]);
}

afterAll(async () => {
  if (driver) {
    const { adopted } = await driver.reconcile().catch(() => ({ adopted: [] }));
    for (const instance of adopted) await driver.kill(instance.instanceId).catch(() => undefined);
    await driver.close();
  }
  for (const registry of [open, secured, mirror]) registry?.process.kill();
  rmSync(tmp, { recursive: true, force: true });
  rmSync(images, { recursive: true, force: true });
}, 60_000);

describe("an OCI image from a registry becomes a template rootfs", () => {
  it("pulls a two-layer image: files with the whiteout applied, its config, its digest, Warren's mount points, shifted owners", async () => {
    const logs: string[] = [];
    const options = pullOptions({ ref: busybox.ref, onLog: (line) => logs.push(line) });
    const pulled = await pullImageRootfs(options);
    const root = options.destRootfs;
    expect(pulled.digest).toMatch(/^sha256:[a-f0-9]{64}$/);
    expect(pulled.digest).toBe(busybox.digest);
    expect(pulled.ref).toBe(busybox.ref);
    expect(pulled.config).toEqual({
      env: ["FOO=bar", "PATH=/usr/local/bin:/usr/bin:/bin"],
      user: "1000:1000",
      workdir: "/work",
      entrypoint: ["/bin/sh", "-c"],
      cmd: ["echo hi"],
    });
    expect(readFileSync(join(root, "etc/greeting"), "utf8")).toBe("hello from the image\n");
    expect(existsSync(join(root, "etc/removed"))).toBe(false);
    expect(existsSync(join(root, "etc/.wh.removed"))).toBe(false);
    expect(readlinkSync(join(root, "bin/sh"))).toBe("busybox");
    // What the driver binds over, and what envd reads.
    for (const dir of ["opt/warren/envd", "opt/warren/proto", "opt/warren/node_modules", "home/user"]) {
      expect(statSync(join(root, dir)).isDirectory()).toBe(true);
    }
    expect(lstatSync(join(root, "usr/local/bin/node")).isFile()).toBe(true);
    expect(readFileSync(join(root, "etc/resolv.conf"), "utf8")).toBe("");
    expect(readFileSync(join(root, "etc/hostname"), "utf8")).toBe("sandbox\n");
    expect(readFileSync(join(root, "etc/passwd"), "utf8")).toContain("user:x:1000:1000::/home/user:/bin/bash\n");
    expect(pulled.prepared.libc).toBe("host");
    expect(pulled.prepared.added).toEqual(expect.arrayContaining(["/usr/bin/tini", "/usr/bin/setpriv", "/bin/bash"]));
    // Owners: image root → sandbox root (100000), image uid 1000 → 101000; nothing left at host ids.
    expect(statSync(root).uid).toBe(UID_BASE);
    expect(statSync(join(root, "bin/busybox")).uid).toBe(UID_BASE);
    expect(statSync(join(root, "work"))).toMatchObject({ uid: UID_BASE + 1000, gid: UID_BASE + 1000 });
    expect(statSync(join(root, "home/user")).uid).toBe(UID_BASE + 1000);
    const { stdout: lowIds } = await run("find", [
      root,
      "-xdev",
      "(",
      "-uid",
      "-65536",
      "-o",
      "-gid",
      "-65536",
      ")",
      "-print",
      "-quit",
    ]);
    expect(lowIds).toBe("");
    expect(readdirSync(options.workDir)).toEqual([]);
    expect(logs.join("\n")).toContain(`resolving ${busybox.ref}`);
    expect(logs.join("\n")).toContain("Copying blob sha256:");
  });

  it("an image without glibc (busybox) boots envd on the host's glibc: commands run as `user` through bash and setpriv", async () => {
    const options = pullOptions({ ref: busybox.ref });
    const pulled = await pullImageRootfs(options);
    await withSandbox("ocibusybox", options.destRootfs, pulled, async (sandbox) => {
      const result = await sandbox.commands.run(
        "id -u; whoami; cat /etc/greeting; echo $HOME; node -e 'console.log(process.version)'",
      );
      expect(result.stdout.split("\n")).toEqual([
        "1000",
        "user",
        "hello from the image",
        "/home/user",
        process.version,
        "",
      ]);
      const root = await sandbox.commands.run("id -u", { user: "root" });
      expect(root.stdout).toBe("0\n");
    });
  });

  it("a Debian image keeps its own glibc; `user` gets uid 1001 next to the image's `ubuntu` and passwordless sudo", async () => {
    const options = pullOptions({ ref: `${open.host}/team/debian:bookworm` });
    const pulled = await pullImageRootfs(options);
    expect(pulled.prepared.libc).toBe("image");
    expect(pulled.prepared.added).toEqual(["/usr/bin/tini"]);
    expect(pulled.prepared.user).toMatchObject({ uid: 1001, created: true, sudo: true });
    expect(pulled.prepared.missingTools).toEqual(["curl", "ss", "pgrep", "inotifywait", "git", "python3"]);
    expect(pulled.config.cmd).toEqual(["/bin/bash"]);
    await withSandbox("ocidebian", options.destRootfs, pulled, async (sandbox) => {
      const result = await sandbox.commands.run("id -u; whoami; cat /etc/greeting; sudo -n id -u; ls -ld $HOME");
      const lines = result.stdout.split("\n");
      expect(lines.slice(0, 4)).toEqual(["1001", "user", "hello from debian", "0"]);
      expect(lines[4]).toMatch(/^drwxr-xr-x \d+ user user .* \/home\/user$/);
    });
  });

  it("a private registry: the right credentials pull; wrong or missing ones are `unauthorized`; the password shows nowhere", async () => {
    const ref = `${secured.host}/private/busybox:v1`;
    const seen: string[] = [];
    let pulling = true;
    const watch = (async () => {
      while (pulling) {
        for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
          const cmdline = (() => {
            try {
              return readFileSync(`/proc/${pid}/cmdline`, "utf8");
            } catch {
              return "";
            }
          })();
          if (cmdline.includes("skopeo")) seen.push(cmdline);
        }
        await new Promise((resolve) => setTimeout(resolve, 2));
      }
    })();
    const logs: string[] = [];
    const options = pullOptions({
      ref,
      credentials: { username: USER, password: PASSWORD },
      onLog: (l) => logs.push(l),
    });
    const pulled = await pullImageRootfs(options).finally(() => {
      pulling = false;
    });
    await watch;
    expect(pulled.digest).toBe(busybox.digest);
    expect(seen.length).toBeGreaterThan(0);
    expect(seen.join("\n")).not.toContain(PASSWORD);
    expect(logs.join("\n")).not.toContain(PASSWORD);
    expect(readdirSync(options.workDir)).toEqual([]);

    const wrong = await failedPull(pullOptions({ ref, credentials: { username: USER, password: "wrong" } }));
    expect(wrong.code).toBe("unauthorized");
    expect(wrong.message).toBe(
      `registry ${secured.host} refused image '${ref}': unauthorized (the credentials were rejected)`,
    );
    const missing = await failedPull(pullOptions({ ref }));
    expect(missing.code).toBe("unauthorized");
    expect(missing.message).toContain("it needs credentials");
    expect(`${wrong.message}${missing.message}`).not.toContain(PASSWORD);
  });

  it("a missing tag, repository or digest is `not_found`, naming the image and the registry", async () => {
    for (const ref of [
      `${open.host}/team/busybox:nope`,
      `${open.host}/team/nothing:v1`,
      `${open.host}/team/busybox@sha256:${"0".repeat(64)}`,
    ]) {
      const error = await failedPull(pullOptions({ ref }));
      expect(error.code).toBe("not_found");
      expect(error.message).toBe(`image '${ref}' not found in registry ${open.host}`);
    }
  });

  it("bad references are `invalid_ref` before any registry is asked", async () => {
    for (const ref of ["", "Team/Img", "img:bad tag", "img@sha256:123", "http://x/y"]) {
      const options = pullOptions({ ref });
      const error = await failedPull(options);
      expect(error.code).toBe("invalid_ref");
      expect(existsSync(options.workDir)).toBe(false);
    }
  });

  it("a manifest list resolves to this host's platform (digest: the list's); a list without it is `unsupported`", async () => {
    const ref = `${open.host}/team/multi:v1`;
    const pulled = await pullImageRootfs(pullOptions({ ref }));
    expect(pulled.digest).toBe(await digestOf(open.host, "team/multi:v1"));
    expect(pulled.digest).not.toBe(busybox.digest);
    expect(pulled.manifestDigest).toBe(busybox.digest);
    const error = await failedPull(pullOptions({ ref: `${open.host}/team/foreign:v1` }));
    expect(error.code).toBe("unsupported");
    expect(error.message).toContain("has no linux/");
    expect(error.message).toContain("(it has: linux/s390x, linux/riscv64)");
  });

  it("zstd layers (which umoci 0.4 cannot unpack) are recompressed on the way in", async () => {
    const options = pullOptions({ ref: `${open.host}/team/busybox:zstd` });
    const pulled = await pullImageRootfs(options);
    const { stdout: raw } = await run(
      "skopeo",
      ["inspect", "--raw", "--tls-verify=false", `docker://${open.host}/team/busybox:zstd`],
      { env: toolEnv },
    );
    expect(raw).toContain("application/vnd.oci.image.layer.v1.tar+zstd");
    expect(pulled.digest).not.toBe(busybox.digest);
    expect(readFileSync(join(options.destRootfs, "etc/greeting"), "utf8")).toBe("hello from the image\n");
    expect(existsSync(join(options.destRootfs, "etc/removed"))).toBe(false);
  });

  it("Docker Hub names go to the configured mirror (library/ prefix, tag)", async () => {
    const logs: string[] = [];
    const pulled = await pullImageRootfs(
      pullOptions({ ref: "busybox:1.35", dockerHubMirror: mirror.host, onLog: (l) => logs.push(l) }),
    );
    expect(pulled.ref).toBe("docker.io/library/busybox:1.35");
    expect(pulled.digest).toBe(busybox.digest);
    expect(logs[0]).toBe(`resolving docker.io/library/busybox:1.35 via mirror ${mirror.host}`);
  });

  it("limits: too large before the download, too slow, an existing destination; none leaves anything", async () => {
    const large = await failedPull(pullOptions({ ref: busybox.ref, maxBytes: 1000 }));
    expect(large.code).toBe("too_large");
    expect(large.message).toMatch(/^image '.*' is too large: its layers are \d+ bytes compressed, the limit is 1000$/);
    const slow = await failedPull(pullOptions({ ref: busybox.ref, timeoutMs: 1 }));
    expect(slow.code).toBe("timeout");
    const taken = pullOptions({ ref: busybox.ref });
    mkdirSync(taken.destRootfs);
    await expect(pullImageRootfs(taken)).rejects.toMatchObject({
      code: "failed",
      message: `${taken.destRootfs} already exists`,
    });
    rmSync(taken.destRootfs, { recursive: true });
  });
});
