import { cp, lchown, lstat, readdir } from "node:fs/promises";
import { join } from "node:path";
import type { Rootfs } from "./rootfs-path.js";

/** E2B's default account: sandbox processes run as `user` unless a request names another. */
export const SANDBOX_USER = "user";
const SUDOERS_LINE = `${SANDBOX_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n`;
const FIRST_UID = 1000;
const LAST_UID = 59999;

export interface SandboxAccount {
  readonly uid: number;
  readonly gid: number;
  readonly home: string;
  readonly shell: string;
  /** False when the image already had a `user` (kept as the image made it). */
  readonly created: boolean;
  /** The image has sudo and `user` may use it without a password (the template must allow setuid). */
  readonly sudo: boolean;
}

interface Entry {
  readonly name: string;
  readonly id: number;
  readonly fields: readonly string[];
}

function parseTable(text: string): Entry[] {
  return text
    .split("\n")
    .map((line) => line.split(":"))
    .filter((fields) => fields.length >= 3 && fields[0] !== "")
    .map((fields) => ({ name: fields[0] as string, id: Number(fields[2]), fields }));
}

function appendLine(text: string, line: string): string {
  return `${text}${text === "" || text.endsWith("\n") ? "" : "\n"}${line}\n`;
}

/** The first id from FIRST_UID up that no entry of `table` uses (useradd's choice). */
function freeId(table: readonly Entry[], preferred?: number): number {
  const used = new Set(table.map((e) => e.id));
  if (preferred !== undefined && !used.has(preferred)) return preferred;
  for (let id = FIRST_UID; id <= LAST_UID; id++) if (!used.has(id)) return id;
  throw new Error("no free id for the sandbox user");
}

/**
 * Gives the image what the `base` template's useradd gave it: root and `user` (uid 1000 unless taken, e.g. by
 * Ubuntu 24.04's `ubuntu`; then the next free one, as useradd picks), a home with /etc/skel's files, a shadow entry
 * when the image has shadow files, and passwordless sudo when the image has sudo. Ids are the image's own; the
 * owner shift after preparation moves them into the sandbox range.
 */
export async function ensureSandboxAccount(image: Rootfs, shell: string): Promise<SandboxAccount> {
  let passwd = (await image.readText("/etc/passwd")) ?? "";
  let group = (await image.readText("/etc/group")) ?? "";
  const hadPasswd = passwd !== "";
  const hadGroup = group !== "";
  if (!parseTable(passwd).some((e) => e.name === "root")) passwd = `root:x:0:0:root:/root:${shell}\n${passwd}`;
  if (!parseTable(group).some((e) => e.name === "root")) group = `root:x:0:\n${group}`;
  const existing = parseTable(passwd).find((e) => e.name === SANDBOX_USER);
  let account: Omit<SandboxAccount, "sudo">;
  if (existing) {
    account = {
      uid: existing.id,
      gid: Number(existing.fields[3]),
      home: existing.fields[5] || `/home/${SANDBOX_USER}`,
      shell: existing.fields[6] || shell,
      created: false,
    };
  } else {
    const uid = freeId(parseTable(passwd));
    const ownGroup = parseTable(group).find((e) => e.name === SANDBOX_USER);
    const gid = ownGroup?.id ?? freeId(parseTable(group), uid);
    const home = `/home/${SANDBOX_USER}`;
    passwd = appendLine(passwd, `${SANDBOX_USER}:x:${uid}:${gid}::${home}:${shell}`);
    if (!ownGroup) group = appendLine(group, `${SANDBOX_USER}:x:${gid}:`);
    const days = Math.floor(Date.now() / 86_400_000);
    await appendIfExists(image, "/etc/shadow", `${SANDBOX_USER}:!:${days}:0:99999:7:::`);
    if (!ownGroup) await appendIfExists(image, "/etc/gshadow", `${SANDBOX_USER}:!::`);
    account = { uid, gid, home, shell, created: true };
  }
  await writeTable(image, "/etc/passwd", passwd, hadPasswd);
  await writeTable(image, "/etc/group", group, hadGroup);
  await ensureHome(image, account);
  return { ...account, sudo: await allowSudo(image) };
}

async function writeTable(image: Rootfs, path: string, text: string, existed: boolean): Promise<void> {
  if (existed) await image.updateFile(path, text);
  else await image.writeFile(path, text, 0o644);
}

async function appendIfExists(image: Rootfs, path: string, line: string): Promise<void> {
  const text = await image.readText(path);
  if (text !== undefined) await image.updateFile(path, appendLine(text, line));
}

async function ensureHome(image: Rootfs, account: Omit<SandboxAccount, "sudo">): Promise<void> {
  const host = await image.resolve(account.home);
  if (await lstat(host).catch(() => undefined)) return;
  await image.mkdir(account.home, 0o755);
  const skel = await image.stat("/etc/skel");
  // Symlinks are copied as symlinks (never followed): they point into the sandbox, not the host.
  if (skel?.isDirectory())
    await cp(await image.resolve("/etc/skel"), host, { recursive: true, verbatimSymlinks: true });
  await chownTree(host, account.uid, account.gid);
}

async function chownTree(path: string, uid: number, gid: number): Promise<void> {
  await lchown(path, uid, gid);
  const st = await lstat(path);
  if (!st.isDirectory()) return;
  for (const name of await readdir(path)) await chownTree(join(path, name), uid, gid);
}

/** Passwordless sudo for `user`, as in `base`, when the image has sudo. */
async function allowSudo(image: Rootfs): Promise<boolean> {
  if (!(await image.isExecutable("/usr/bin/sudo"))) return false;
  await image.mkdir("/etc/sudoers.d", 0o755);
  await image.writeFile(`/etc/sudoers.d/${SANDBOX_USER}`, SUDOERS_LINE, 0o440);
  const sudoers = await image.readText("/etc/sudoers");
  if (sudoers !== undefined && !/^[#@]includedir\s+\/etc\/sudoers\.d\s*$/m.test(sudoers)) {
    await image.updateFile("/etc/sudoers", appendLine(sudoers, "@includedir /etc/sudoers.d"));
  }
  return true;
}
