import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { exec } from "../runtime/exec.js";
import { hostDebianMirror } from "./mirror.js";
import { type PreparedRootfs, prepareRootfs } from "./oci/prepare.js";

/**
 * A Debian root filesystem as a template base: a suite's minimal system with `packages` (installed by debootstrap),
 * then `aptPackages` installed by apt over it. debootstrap configures what it installs in one pass and fails on
 * larger sets (python3-zmq and the Jupyter stack, measured): those go to apt, as in a Dockerfile's apt-get install.
 */
export interface DebianSource {
  readonly suite: string;
  readonly packages: readonly string[];
  readonly aptPackages?: readonly string[];
}

/** Suites and package names as Debian spells them; anything else never reaches debootstrap's command line. */
const SUITE = /^[a-z][a-z0-9-]{1,31}$/;
const PACKAGE = /^[a-z0-9][a-z0-9+.-]{1,99}$/;
const MAX_PACKAGES = 512;

export class DebianSourceError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DebianSourceError";
  }
}

/** Checks a source's names; the packages sorted and without duplicates (the same set is the same base). */
export function normalizeDebianSource(source: DebianSource): DebianSource {
  if (!SUITE.test(source.suite)) throw new DebianSourceError(`'${source.suite}' is not a Debian suite name`);
  const apt = source.aptPackages ?? [];
  if (source.packages.length + apt.length > MAX_PACKAGES) {
    throw new DebianSourceError(
      `a Debian base takes at most ${MAX_PACKAGES} packages, got ${source.packages.length + apt.length}`,
    );
  }
  for (const name of [...source.packages, ...apt]) {
    if (!PACKAGE.test(name)) throw new DebianSourceError(`'${name}' is not a Debian package name`);
  }
  const sorted = (names: readonly string[]) => [...new Set(names)].sort();
  return {
    suite: source.suite,
    packages: sorted(source.packages),
    ...(apt.length > 0 ? { aptPackages: sorted(apt) } : {}),
  };
}

/**
 * apt inside the new system, in a private mount namespace (proc and dev mounted there only), with the host's DNS
 * for the download; the system's resolv.conf is emptied afterwards by the preparation.
 */
const APT_INSTALL = `set -e
R="$1"
shift
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
cp /etc/resolv.conf "$R/etc/resolv.conf"
chroot "$R" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$R" apt-get install -y -qq --no-install-recommends "$@"
`;

/** The mirror debootstrap fetches `suite` from: the configured one, the host's own apt source, or Debian's CDN. */
export function debianMirror(suite: string, configured: string | undefined): string {
  return configured ?? hostDebianMirror(suite) ?? "http://deb.debian.org/debian";
}

/** A mirror as logs may show it: a user and password in its URL (a private mirror's) are left out. */
export function mirrorForLog(mirror: string): string {
  try {
    const url = new URL(mirror);
    if (!url.username && !url.password) return mirror;
    url.username = "";
    url.password = "";
    return url.toString();
  } catch {
    return mirror.replace(/\/\/[^/@]*@/, "//");
  }
}

/**
 * Runs debootstrap (minbase and `include`) into `rootfs`, in a private mount namespace so the proc and dev mounts
 * it makes inside never reach the host's. Its per-package chatter is left out of `onLine`.
 */
async function debootstrap(options: {
  readonly suite: string;
  readonly include: readonly string[];
  readonly rootfs: string;
  readonly mirror: string;
  readonly onLine: (line: string) => void;
}): Promise<void> {
  const include = options.include.length > 0 ? [`--include=${options.include.join(",")}`] : [];
  await exec(
    "unshare",
    [
      "--mount",
      "--propagation",
      "private",
      "debootstrap",
      "--variant=minbase",
      ...include,
      options.suite,
      options.rootfs,
      options.mirror,
    ],
    {
      onLine: (line) => {
        if (/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) [a-z0-9]/.test(line)) return;
        // A private mirror's user and password never reach a log through debootstrap's messages.
        if (line.trim()) options.onLine(line.trim().replace(/\/\/[^/@\s]*@/g, "//"));
      },
    },
  );
}

export interface DebianRootfsOptions {
  readonly source: DebianSource;
  /** Default: debianMirror(suite, undefined). */
  readonly mirror?: string;
  /** Where the prepared rootfs goes; must not exist. It appears whole (renamed from a sibling) or not at all. */
  readonly destRootfs: string;
  readonly uidBase: number;
  readonly nodeBinary: string;
  readonly envdRoot: string;
  readonly onLog?: (line: string) => void;
}

export interface DebianRootfs {
  readonly mirror: string;
  /** sha256 of the installed packages and their versions (`dpkg-query`): what this base holds, as a digest. */
  readonly digest: string;
  readonly packageCount: number;
  readonly prepared: PreparedRootfs;
}

/**
 * A Debian root filesystem made on this host, as a template base the way an OCI image is one (oci/pull.ts): the
 * suite's minbase and the packages by debootstrap from the mirror (the host's network: like an image pull, the
 * fetch happens outside any sandbox, from Debian's signed archive), apt's caches emptied, then prepared for envd
 * by the same code that prepares images (oci/prepare.ts: `user`, mount points, owners shifted into the sandbox
 * range).
 */
export async function debianRootfs(options: DebianRootfsOptions): Promise<DebianRootfs> {
  const source = normalizeDebianSource(options.source);
  const log = options.onLog ?? (() => undefined);
  if (existsSync(options.destRootfs)) throw new Error(`${options.destRootfs} already exists`);
  const mirror = options.mirror ?? debianMirror(source.suite, undefined);
  await mkdir(dirname(options.destRootfs), { recursive: true });
  const staging = join(
    dirname(options.destRootfs),
    `.${basename(options.destRootfs)}.debootstrap-${randomBytes(4).toString("hex")}`,
  );
  const started = Date.now();
  try {
    log(
      `debootstrap ${source.suite} minbase${source.packages.length ? ` + ${source.packages.join(" ")}` : ""} from ${mirrorForLog(mirror)}`,
    );
    await debootstrap({ suite: source.suite, include: source.packages, rootfs: staging, mirror, onLine: log });
    if (source.aptPackages?.length) {
      log(`apt-get install ${source.aptPackages.join(" ")}`);
      await exec("unshare", [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        APT_INSTALL,
        "apt",
        staging,
        ...source.aptPackages,
      ]);
    }
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own format, not a JavaScript template.
    const installed = await exec("chroot", [staging, "dpkg-query", "-W", "-f", "${Package} ${Version}\\n"]);
    const lines = installed.stdout.split("\n").filter(Boolean).sort();
    await exec("sh", ["-c", 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/archives/*.deb', "clean", staging]);
    const prepared = await prepareRootfs(staging, {
      imageName: `debian:${source.suite}`,
      uidBase: options.uidBase,
      nodeBinary: options.nodeBinary,
      envdRoot: options.envdRoot,
      onLog: log,
    });
    await rename(staging, options.destRootfs);
    log(
      `rootfs ready: ${lines.length} packages, ${(prepared.bytes / 1e6).toFixed(1)} MB in ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
    return {
      mirror,
      digest: `sha256:${createHash("sha256").update(lines.join("\n")).digest("hex")}`,
      packageCount: lines.length,
      prepared,
    };
  } finally {
    await rm(staging, { recursive: true, force: true });
  }
}
