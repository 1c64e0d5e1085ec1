/**
 * Docker Hub for E2B's template tests, on loopback. Their builds start `fromImage('ubuntu:22.04')`; no public
 * registry is reachable here (and a test never reaches the internet), so the runner starts Debian's
 * `docker-registry` on 127.0.0.1, pushes a stand-in under Docker Hub's name for it, and points the cluster's node
 * agent at it (`WARREN_IMAGE_MIRROR`, as a platform team points Warren at its own mirror). The stand-in is a Debian
 * minbase root (debootstrap, from Debian's mirror, cached between runs): the same shell and coreutils those tests
 * use, not Ubuntu's bytes — what is tested is Warren's pull, unpack and build path, never the distribution.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { join } from "node:path";

/** Docker Hub names the suites build from → the Debian suite of their stand-in. */
const STAND_INS = [{ image: "library/ubuntu:22.04", suite: "bookworm" }];

const IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** A Debian minbase root for `suite`, made once under `cacheDir` (about a minute from a fast mirror). */
function standInRoot(cacheDir, suite, log) {
  const root = join(cacheDir, `debian-${suite}-minbase`);
  if (existsSync(join(root, "bin/sh"))) return root;
  const partial = `${root}.partial`;
  rmSync(partial, { recursive: true, force: true });
  mkdirSync(cacheDir, { recursive: true });
  log(`making the stand-in image's root: debootstrap --variant=minbase ${suite} (once; kept in ${cacheDir})`);
  const mirror = process.env.WARREN_DEBIAN_MIRROR || "http://deb.debian.org/debian";
  execFileSync("debootstrap", ["--variant=minbase", suite, partial, mirror], { stdio: ["ignore", "pipe", "pipe"] });
  // apt's downloaded packages are not part of an image.
  rmSync(join(partial, "var/cache/apt/archives"), { recursive: true, force: true });
  mkdirSync(join(partial, "var/cache/apt/archives/partial"), { recursive: true });
  renameSync(partial, root);
  return root;
}

/**
 * Starts the mirror with every stand-in pushed; resolves with its `host:port` (for `WARREN_IMAGE_MIRROR` and
 * `WARREN_INSECURE_REGISTRIES`) and a `stop`.
 */
export async function startImageMirror({ workDir, cacheDir, log }) {
  const { pushRootfsImage, startRegistry } = await import("../dist/registry.js");
  const registry = await startRegistry(join(workDir, "image-mirror"));
  try {
    for (const { image, suite } of STAND_INS) {
      const root = standInRoot(cacheDir, suite, log);
      const imageWork = join(workDir, "image-mirror", image.replace(/[/:]/g, "_"));
      rmSync(imageWork, { recursive: true, force: true });
      mkdirSync(imageWork, { recursive: true });
      await pushRootfsImage(imageWork, root, `${registry.host}/${image}`, {
        env: [`PATH=${IMAGE_PATH}`],
        cmd: ["bash"],
      });
      rmSync(imageWork, { recursive: true, force: true });
      log(`pushed ${image} (a stand-in: Debian ${suite} minbase) to the loopback mirror ${registry.host}`);
    }
  } catch (error) {
    await registry.process.stop();
    throw error;
  }
  return { host: registry.host, stop: () => registry.process.stop() };
}
