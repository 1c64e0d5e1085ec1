import { readFileSync, statSync } from "node:fs";
import { unauthenticated } from "./errors.js";

/** A Linux account that processes and file operations run as. */
export interface SandboxUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
  readonly home: string;
  /** Every group the account belongs to, primary group included (as initgroups(3) sets them). */
  readonly groups: readonly number[];
}

interface AccountTables {
  byName: Map<string, SandboxUser>;
  userNames: Map<number, string>;
  groupNames: Map<number, string>;
}

/**
 * Reads accounts from /etc/passwd and /etc/group. The tables are re-read only when either
 * file changes (a template may add users after envd starts), so a lookup costs two stat calls.
 */
export class UserDirectory {
  private tables: AccountTables | undefined;
  private stamp = "";

  constructor(
    private readonly passwdFile = "/etc/passwd",
    private readonly groupFile = "/etc/group",
  ) {}

  /** The account called `name`; unknown names are E2B's `unauthenticated` error. */
  lookup(name: string): SandboxUser {
    const user = this.load().byName.get(name);
    if (!user) throw unauthenticated(`invalid username: '${name}'`);
    return user;
  }

  find(name: string): SandboxUser | undefined {
    return this.load().byName.get(name);
  }

  /** The user name of a uid, or the uid as text when no account has it (as `ls -l` shows). */
  userName(uid: number): string {
    return this.load().userNames.get(uid) ?? String(uid);
  }

  groupName(gid: number): string {
    return this.load().groupNames.get(gid) ?? String(gid);
  }

  private load(): AccountTables {
    const stamp = `${statSync(this.passwdFile).mtimeMs}:${statSync(this.groupFile).mtimeMs}`;
    if (this.tables && stamp === this.stamp) return this.tables;
    this.tables = parseAccounts(readFileSync(this.passwdFile, "utf8"), readFileSync(this.groupFile, "utf8"));
    this.stamp = stamp;
    return this.tables;
  }
}

function parseAccounts(passwd: string, group: string): AccountTables {
  const groupNames = new Map<number, string>();
  const memberships = new Map<string, number[]>();
  for (const line of group.split("\n")) {
    const [name, , gidText, members] = line.split(":");
    if (!name || gidText === undefined) continue;
    const gid = Number(gidText);
    if (!groupNames.has(gid)) groupNames.set(gid, name);
    for (const member of (members ?? "").split(",").filter(Boolean)) {
      const list = memberships.get(member) ?? [];
      list.push(gid);
      memberships.set(member, list);
    }
  }
  const byName = new Map<string, SandboxUser>();
  const userNames = new Map<number, string>();
  for (const line of passwd.split("\n")) {
    const [name, , uidText, gidText, , home] = line.split(":");
    if (!name || uidText === undefined || gidText === undefined) continue;
    const uid = Number(uidText);
    const gid = Number(gidText);
    const groups = [gid, ...(memberships.get(name) ?? []).filter((g) => g !== gid)];
    byName.set(name, { name, uid, gid, home: home || "/", groups });
    if (!userNames.has(uid)) userNames.set(uid, name);
  }
  return { byName, userNames, groupNames };
}
