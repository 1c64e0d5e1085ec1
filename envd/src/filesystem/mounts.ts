import { readFile } from "node:fs/promises";

export interface MountPoint {
  readonly mountPoint: string;
  readonly fsType: string;
}

/** Filesystems inotify cannot see remote changes on: NFS, CIFS/SMB and every FUSE mount. */
const NETWORK_FS = /^(nfs|nfs4|cifs|smb|smb2|smb3|smbfs|fuse|fuseblk|fuse\..+)$/;

/** Octal escapes (`\040` for a space) as the kernel writes them in mountinfo. */
function unescapeMountField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** Parses /proc/<pid>/mountinfo: field 5 is the mount point, the field after " - " the type. */
export function parseMountInfo(text: string): MountPoint[] {
  const mounts: MountPoint[] = [];
  for (const line of text.split("\n")) {
    const separator = line.indexOf(" - ");
    if (separator === -1) continue;
    const before = line.slice(0, separator).split(" ");
    const after = line.slice(separator + 3).split(" ");
    const mountPoint = before[4];
    const fsType = after[0];
    if (mountPoint && fsType) mounts.push({ mountPoint: unescapeMountField(mountPoint), fsType });
  }
  return mounts;
}

/** The mount `path` (absolute, symlinks resolved) lives on: the longest mount point containing it; later mounts win ties. */
export function mountOf(path: string, mounts: readonly MountPoint[]): MountPoint | undefined {
  let best: MountPoint | undefined;
  for (const mount of mounts) {
    const root = mount.mountPoint;
    const inside = root === "/" || path === root || path.startsWith(`${root}/`);
    if (inside && (!best || root.length >= best.mountPoint.length)) best = mount;
  }
  return best;
}

export function isNetworkFsType(fsType: string): boolean {
  return NETWORK_FS.test(fsType);
}

/** Whether `resolvedPath` is on a network or FUSE filesystem, per /proc/self/mountinfo. */
export async function isOnNetworkMount(resolvedPath: string, mountInfoFile = "/proc/self/mountinfo"): Promise<boolean> {
  const text = await readFile(mountInfoFile, "utf8").catch(() => "");
  const mount = mountOf(resolvedPath, parseMountInfo(text));
  return mount !== undefined && isNetworkFsType(mount.fsType);
}
