import { chmod, copyFile, readdir, readFile, realpath, stat } from "node:fs/promises";
import { basename, join, relative } from "node:path";
import { type ElfInfo, readElf } from "./elf.js";
import { ImageError } from "./errors.js";
import { Rootfs } from "./rootfs-path.js";

/**
 * What envd needs from an image it was not built into. The namespace driver bind-mounts the host's `node` (a
 * glibc binary) at /opt/warren/bin/node (and over an empty /usr/local/bin/node) and starts `/usr/bin/tini -g -- node envd`; envd starts every process of
 * `user` through `/usr/bin/setpriv`, and E2B's SDK runs commands with `/bin/bash -l -c`. So an image needs a glibc
 * loader and libraries that node can use, and those three programs.
 *
 * - An image with GNU libc (Debian, Ubuntu, most others) keeps its own: node loads the image's libc, so that libc
 *   must define every symbol version node needs (Node 20 needs GLIBC_2.28: Ubuntu ≥ 20.04, Debian ≥ 10).
 *   Libraries it lacks (libstdc++ in a distroless or busybox:glibc image) are copied from the host next to its libc.
 * - An image without glibc (Alpine's musl, busybox, scratch) gets the host's loader at node's interpreter path and
 *   the libraries node needs in /lib/<triplet>, where only the glibc loader looks (musl's never does), so the
 *   image's own programs are unaffected.
 * - A missing tini is the host's static tini; a missing setpriv or bash is the host's, with what it links
 *   against. A busybox setpriv applet does not count: it has no --reuid/--regid/--init-groups.
 * - An image with one half of glibc (a loader but no libc.so.6, e.g. Alpine's gcompat; or the reverse) cannot be
 *   made consistent without overwriting its files, and is refused.
 */
export interface EnvdRuntime {
  /** Whose glibc node loads in the sandbox: the image's, or the host's copied in (`none`: a static node). */
  readonly libc: "image" | "host" | "none";
  /** Files copied from the host into the image, as paths in the image. */
  readonly added: readonly string[];
}

export interface EnvdRuntimeOptions {
  /** For messages. */
  readonly imageName: string;
  /** The host binary the driver bind-mounts at /opt/warren/bin/node. */
  readonly nodeBinary: string;
  /** The directory whose node_modules the driver bind-mounts at /opt/warren/node_modules (envd's native modules). */
  readonly envdRoot: string;
}

const TRIPLETS: Readonly<Record<string, string>> = { x64: "x86_64-linux-gnu", arm64: "aarch64-linux-gnu" };

/** Where a glibc loader looks for libraries (after its cache), in its order. */
function systemDirs(triplet: string): string[] {
  return [`/lib/${triplet}`, `/usr/lib/${triplet}`, "/lib64", "/usr/lib64", "/lib", "/usr/lib"];
}

interface Tool {
  readonly path: string;
  /** Host binaries to copy when the image lacks it, first found wins. */
  readonly host: readonly string[];
  readonly rejectBusybox?: boolean;
}

const TOOLS: readonly Tool[] = [
  { path: "/usr/bin/tini", host: ["/usr/bin/tini-static", "/usr/bin/tini"] },
  { path: "/usr/bin/setpriv", host: ["/usr/bin/setpriv"], rejectBusybox: true },
  { path: "/bin/bash", host: ["/bin/bash", "/usr/bin/bash"] },
];

interface Library {
  /** Path in its root. */
  readonly path: string;
  readonly elf: ElfInfo;
}

async function findLibrary(
  root: Rootfs,
  soname: string,
  dirs: readonly string[],
  machine: number,
): Promise<Library | undefined> {
  for (const dir of dirs) {
    const path = `${dir}/${soname}`;
    const st = await root.stat(path);
    if (!st?.isFile()) continue;
    const elf = await readElf(await root.resolve(path)).catch(() => undefined);
    if (elf?.machine === machine) return { path, elf };
  }
  return undefined;
}

/** Gives `image` what envd needs to start (see EnvdRuntime); throws `unsupported` when it cannot. */
export async function installEnvdRuntime(image: Rootfs, options: EnvdRuntimeOptions): Promise<EnvdRuntime> {
  const triplet = TRIPLETS[process.arch];
  if (!triplet) throw new ImageError("failed", `images are not supported on ${process.arch} hosts`);
  const node = await readElf(options.nodeBinary);
  if (!node) throw new ImageError("failed", `${options.nodeBinary} is not an ELF binary`);
  const host = new Rootfs("/");
  const dirs = systemDirs(triplet);
  const added: string[] = [];
  const interpreter = node.interpreter;
  if (!interpreter) {
    await installTools(image, host, undefined, options, added);
    return { libc: "none", added };
  }
  const { imageName } = options;
  const hasLoader = (await image.stat(interpreter))?.isFile() === true;
  const libc = await findLibrary(image, "libc.so.6", dirs, node.machine);
  const isGlibc = libc?.elf.versionsDefined.some((v) => v.startsWith("GLIBC_2.")) === true;
  let linker: Linker;
  if (hasLoader && libc && isGlibc) {
    const libDir = libc.path.slice(0, libc.path.lastIndexOf("/"));
    linker = new Linker({ image, host, hostDirs: dirs, node, imageName, libDir, searchDirs: [libDir, ...dirs], added });
  } else if (!hasLoader && !libc) {
    const hostLoader = await realpath(interpreter);
    await copyInto(image, hostLoader, interpreter);
    added.push(interpreter);
    const libDir = `/lib/${triplet}`;
    // Only the multiarch dirs: /lib and /usr/lib hold the image's own (musl) libraries.
    const searchDirs = [libDir, `/usr/lib/${triplet}`];
    linker = new Linker({ image, host, hostDirs: dirs, node, imageName, libDir, searchDirs, added });
  } else {
    const has = hasLoader
      ? `a program loader at ${interpreter} but no GNU libc`
      : `a libc.so.6 but no loader at ${interpreter}`;
    throw new ImageError(
      "unsupported",
      `image '${imageName}' has ${has}; envd runs on the host's glibc node and needs both or neither`,
    );
  }
  await linker.satisfy("the host's node (envd's runtime)", node);
  // envd's native modules (node-pty links libutil) load into node with the same loader. Builds for other
  // platforms or libcs in those packages (the host could not load them either) are not envd's.
  for (const addon of await envdNativeModules(options.envdRoot)) {
    const elf = await readElf(addon).catch(() => undefined);
    if (elf?.machine !== node.machine || !(await loadable(host, dirs, elf, basename(interpreter)))) continue;
    await linker.satisfy(`envd's native module ${relative(options.envdRoot, addon)}`, elf);
  }
  await installTools(image, host, linker, options, added);
  return { libc: hasLoader ? "image" : "host", added };
}

async function installTools(
  image: Rootfs,
  host: Rootfs,
  linker: Linker | undefined,
  options: EnvdRuntimeOptions,
  added: string[],
): Promise<void> {
  for (const tool of TOOLS) {
    if ((await image.isExecutable(tool.path)) && !(tool.rejectBusybox && (await isBusybox(image, tool.path)))) continue;
    let installed = false;
    for (const candidate of tool.host) {
      const elf = (await host.isExecutable(candidate)) ? await readElf(candidate) : undefined;
      if (!elf) continue;
      // A dynamic host binary needs the loader the image now has (node's); without one only a static binary fits.
      if (elf.interpreter && elf.interpreter !== linker?.interpreter) continue;
      await copyInto(image, await realpath(candidate), tool.path);
      added.push(tool.path);
      if (elf.interpreter && linker) await linker.satisfy(`${tool.path} (from the host)`, elf);
      installed = true;
      break;
    }
    if (!installed) {
      throw new ImageError(
        "failed",
        `image '${options.imageName}' has no ${tool.path} and the host has none to give it (${tool.host.join(" or ")})`,
      );
    }
  }
}

/**
 * The `*.node` files (native Node modules) of envd's dependency tree: envd/package.json's dependencies and
 * optional dependencies, transitively, as npm installed them under `envdRoot`.
 */
async function envdNativeModules(envdRoot: string): Promise<string[]> {
  const packages = new Set<string>();
  const pending = [join(envdRoot, "envd")];
  while (pending.length > 0) {
    const dir = pending.pop() as string;
    const manifest = JSON.parse(await readFile(join(dir, "package.json"), "utf8").catch(() => "{}")) as {
      dependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    for (const name of Object.keys({ ...manifest.dependencies, ...manifest.optionalDependencies })) {
      for (const candidate of [join(dir, "node_modules", name), join(envdRoot, "node_modules", name)]) {
        if (!(await stat(candidate).catch(() => undefined))?.isDirectory()) continue;
        const real = await realpath(candidate);
        if (!packages.has(real)) {
          packages.add(real);
          pending.push(real);
        }
        break;
      }
    }
  }
  const modules: string[] = [];
  for (const dir of packages) {
    const entries = await readdir(dir, { recursive: true });
    for (const entry of entries) if (entry.endsWith(".node")) modules.push(join(dir, entry));
  }
  return modules;
}

/** Whether the host's own loader could load `elf`: every library it needs, with every version it needs. */
async function loadable(host: Rootfs, dirs: readonly string[], elf: ElfInfo, loader: string): Promise<boolean> {
  for (const soname of elf.needed) {
    if (soname === loader) continue;
    const library = await findLibrary(host, soname, dirs, elf.machine);
    const defined = new Set(library?.elf.versionsDefined);
    if (!library || (elf.versionsNeeded.get(soname) ?? []).some((v) => !defined.has(v))) return false;
  }
  return true;
}

async function isBusybox(image: Rootfs, path: string): Promise<boolean> {
  const host = await image.resolve(path);
  if (basename(host) === "busybox") return true;
  const st = await stat(host);
  if (st.size > 8 * 1024 * 1024) return false;
  return (await readFile(host)).includes("BusyBox v");
}

async function copyInto(image: Rootfs, hostFile: string, path: string): Promise<void> {
  const dest = await image.replaceable(path);
  await copyFile(hostFile, dest);
  await chmod(dest, 0o755);
}

interface LinkerOptions {
  readonly image: Rootfs;
  readonly host: Rootfs;
  /** Where the host's libraries are. */
  readonly hostDirs: readonly string[];
  /** The host's node: its machine and loader are what every copied binary must share. */
  readonly node: ElfInfo;
  readonly imageName: string;
  /** Where copied libraries go (in the image). */
  readonly libDir: string;
  /** Where the image's loader finds libraries, in its order. */
  readonly searchDirs: readonly string[];
  /** Collects the copied files. */
  readonly added: string[];
}

/** Makes the image's loader find every library an ELF object needs, copying the host's where the image has none. */
class Linker {
  constructor(private readonly options: LinkerOptions) {}

  get interpreter(): string | undefined {
    return this.options.node.interpreter;
  }

  async satisfy(who: string, elf: ElfInfo): Promise<void> {
    const { image, host, hostDirs, node, imageName, libDir, searchDirs, added } = this.options;
    for (const soname of elf.needed) {
      // The loader itself is always loaded.
      if (soname === basename(node.interpreter ?? "")) continue;
      let library = await findLibrary(image, soname, searchDirs, node.machine);
      if (!library) {
        const hostLibrary = await findLibrary(host, soname, hostDirs, node.machine);
        if (!hostLibrary) throw new ImageError("failed", `the host has no ${soname}, which ${who} needs`);
        const path = `${libDir}/${soname}`;
        await copyInto(image, await realpath(hostLibrary.path), path);
        added.push(path);
        library = { path, elf: hostLibrary.elf };
        await this.satisfy(`${soname} (from the host)`, hostLibrary.elf);
      }
      const defined = new Set(library.elf.versionsDefined);
      const missing = (elf.versionsNeeded.get(soname) ?? []).filter((v) => !defined.has(v));
      if (missing.length > 0) {
        throw new ImageError(
          "unsupported",
          `image '${imageName}' is too old for envd: its ${library.path} lacks ${missing.join(", ")}, which ${who} needs`,
        );
      }
    }
  }
}
