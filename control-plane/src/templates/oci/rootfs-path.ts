import { constants, type Stats } from "node:fs";
import { lstat, mkdir, open, readFile, readlink, rm, stat } from "node:fs/promises";
import { join, resolve as resolvePath } from "node:path";

/**
 * Paths inside an unpacked image, resolved as the sandbox would see them. An image is untrusted: `/etc` may be a
 * symlink to `/etc` or `../../..`, which `join(rootfs, "etc/passwd")` would follow out to the host's own files.
 * Every path the preparation touches goes through here: symlinks are followed with the rootfs as `/`, and `..`
 * never climbs above it. The rootfs is ours alone while it is prepared (nothing runs in it), so resolving first
 * and then acting on the resolved path is not racy.
 */
export class Rootfs {
  readonly root: string;

  constructor(root: string) {
    this.root = resolvePath(root);
  }

  /**
   * The host path of `path` in the image. `followLast` false keeps a symlink in the last component (to replace
   * it); components that do not exist are taken literally.
   */
  async resolve(path: string, followLast = true): Promise<string> {
    const pending = path.split("/").filter((c) => c !== "" && c !== ".");
    const resolved: string[] = [];
    let links = 0;
    while (pending.length > 0) {
      const name = pending.shift() as string;
      if (name === "..") {
        resolved.pop();
        continue;
      }
      const candidate = join(this.root, ...resolved, name);
      const st = await lstat(candidate).catch(() => undefined);
      if (st?.isSymbolicLink() && (pending.length > 0 || followLast)) {
        if (++links > 40) throw new Error(`too many symbolic links in '${path}' of the image`);
        const target = await readlink(candidate);
        if (target.startsWith("/")) resolved.length = 0;
        pending.unshift(...target.split("/").filter((c) => c !== "" && c !== "."));
        continue;
      }
      resolved.push(name);
    }
    return join(this.root, ...resolved);
  }

  /** The file's stat (symlinks followed inside the image), or undefined. */
  async stat(path: string): Promise<Stats | undefined> {
    return stat(await this.resolve(path)).catch(() => undefined);
  }

  async isExecutable(path: string): Promise<boolean> {
    const st = await this.stat(path);
    return st?.isFile() === true && (st.mode & 0o111) !== 0;
  }

  async readText(path: string): Promise<string | undefined> {
    const st = await this.stat(path);
    return st?.isFile() ? readFile(await this.resolve(path), "utf8") : undefined;
  }

  /**
   * Creates `path` and missing parents; returns the host path. The resolved path has no symlink left in it, so
   * creating what is missing along it stays inside the image.
   */
  async mkdir(path: string, mode = 0o755): Promise<string> {
    const host = await this.resolve(path);
    await mkdir(host, { recursive: true, mode });
    if (!(await lstat(host)).isDirectory()) throw new Error(`'${path}' in the image is not a directory`);
    return host;
  }

  /**
   * The host path where a new regular file `path` goes: its parent is created, whatever was at `path` (file,
   * symlink, directory) is removed.
   */
  async replaceable(path: string): Promise<string> {
    const slash = path.lastIndexOf("/");
    const parent = await this.mkdir(path.slice(0, slash) || "/");
    const host = join(parent, path.slice(slash + 1));
    await rm(host, { recursive: true, force: true });
    return host;
  }

  /** Writes a regular file at `path`, replacing whatever was there (a symlink is replaced, never followed). */
  async writeFile(path: string, content: string | Buffer, mode = 0o644): Promise<void> {
    const host = await this.replaceable(path);
    const file = await open(
      host,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      mode,
    );
    try {
      await file.writeFile(content);
      await file.chmod(mode);
    } finally {
      await file.close();
    }
  }

  /** Rewrites the file `path` points to (following symlinks inside the image), keeping its mode. */
  async updateFile(path: string, content: string): Promise<void> {
    const host = await this.resolve(path);
    const file = await open(host, constants.O_WRONLY | constants.O_TRUNC | constants.O_NOFOLLOW);
    try {
      await file.writeFile(content);
    } finally {
      await file.close();
    }
  }
}
