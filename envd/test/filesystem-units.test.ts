import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { EventType } from "@warren/proto/filesystem/filesystem_pb";
import { afterEach, describe, expect, test, vi } from "vitest";
import { fileModeString } from "../src/filesystem/entry-info.js";
import { MAX_METADATA_KEY_BYTES, validateMetadata } from "../src/filesystem/metadata.js";
import { isNetworkFsType, isOnNetworkMount, mountOf, parseMountInfo } from "../src/filesystem/mounts.js";
import { ancestorsOf, mayAccess, READ, SEARCH, WRITE } from "../src/filesystem/permissions.js";
import { InotifyEventMapper, InotifyOutputParser, type WatchEvent } from "../src/filesystem/watch-events.js";
import { keepaliveIntervalMs, MessageQueue } from "../src/filesystem/watch-stream.js";
import { authorizeFiles, parseFilesQuery } from "../src/http/files.js";
import { contentTypeByExtension, sniffContentType } from "../src/http/files-content-type.js";
import { contentDisposition } from "../src/http/files-download.js";
import { negotiateEncoding, parseRange } from "../src/http/files-negotiation.js";
import type { SandboxUser } from "../src/users.js";

describe("Go FileMode strings", () => {
  test.each([
    [0o100644, "-rw-r--r--"],
    [0o040755, "drwxr-xr-x"],
    [0o120777, "Lrwxrwxrwx"],
    [0o041777, "dtrwxrwxrwx"],
    [0o104755, "urwxr-xr-x"],
    [0o102755, "grwxr-xr-x"],
    [0o020666, "Dcrw-rw-rw-"],
    [0o060660, "Drw-rw----"],
    [0o010644, "prw-r--r--"],
    [0o140755, "Srwxr-xr-x"],
  ])("mode %o prints as %s", (mode, text) => {
    expect(fileModeString(mode)).toBe(text);
  });
});

describe("network mount detection", () => {
  const mountinfo = [
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
    "40 27 0:50 / /mnt/share rw,relatime - nfs4 server:/export rw",
    "41 27 0:51 / /mnt/with\\040space rw - fuse.sshfs host: rw",
    "42 40 0:52 / /mnt/share/local rw - tmpfs tmpfs rw",
  ].join("\n");
  const mounts = parseMountInfo(mountinfo);

  test("mountinfo fields are parsed with octal escapes decoded", () => {
    expect(mounts.map((m) => m.mountPoint)).toEqual(["/", "/mnt/share", "/mnt/with space", "/mnt/share/local"]);
  });

  test("a path belongs to its longest mount point", () => {
    expect(mountOf("/home/user", mounts)?.fsType).toBe("ext4");
    expect(mountOf("/mnt/share/x/y", mounts)?.fsType).toBe("nfs4");
    expect(mountOf("/mnt/share/local/z", mounts)?.fsType).toBe("tmpfs");
    expect(mountOf("/mnt/shared", mounts)?.fsType).toBe("ext4");
    expect(mountOf("/mnt/with space/doc", mounts)?.fsType).toBe("fuse.sshfs");
  });

  test("NFS, CIFS/SMB and FUSE count as network filesystems; local ones do not", () => {
    for (const type of ["nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse", "fuseblk", "fuse.sshfs"]) {
      expect(isNetworkFsType(type)).toBe(true);
    }
    for (const type of ["ext4", "xfs", "tmpfs", "overlay", "btrfs", "virtiofs"])
      expect(isNetworkFsType(type)).toBe(false);
  });

  test("isOnNetworkMount reads a mountinfo file", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mountinfo-"));
    try {
      writeFileSync(join(dir, "mountinfo"), mountinfo);
      expect(await isOnNetworkMount("/mnt/share/a", join(dir, "mountinfo"))).toBe(true);
      expect(await isOnNetworkMount("/home/user", join(dir, "mountinfo"))).toBe(false);
    } finally {
      rmSync(dir, { recursive: true });
    }
  });
});

describe("inotifywait output", () => {
  test("records split across chunks and names with newlines parse", () => {
    const parser = new InotifyOutputParser();
    const raw = Buffer.from("CREATE\0/w/a\nb\0CLOSE_WRITE,CLOSE\0/w/a\nb\0MOVED_TO,ISDIR\0/w/dir\0");
    const records = [
      ...parser.push(raw.subarray(0, 9)),
      ...parser.push(raw.subarray(9, 30)),
      ...parser.push(raw.subarray(30)),
    ];
    expect(records.map((r) => [[...r.flags].join(","), r.path])).toEqual([
      ["CREATE", "/w/a\nb"],
      ["CLOSE_WRITE,CLOSE", "/w/a\nb"],
      ["MOVED_TO,ISDIR", "/w/dir"],
    ]);
  });
});

describe("inotify events become E2B events", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  const mapperWith = (events: WatchEvent[]) => new InotifyEventMapper("/w", (event) => events.push(event), 100);
  const record = (flags: string, path: string) => ({ flags: new Set(flags.split(",")), path });

  test("fsnotify naming: MOVED_TO is CREATE, MOVED_FROM RENAME, ATTRIB CHMOD, DELETE REMOVE", () => {
    const events: WatchEvent[] = [];
    const mapper = mapperWith(events);
    mapper.handle(record("MOVED_TO", "/w/a"));
    mapper.handle(record("MOVED_FROM", "/w/b"));
    mapper.handle(record("ATTRIB", "/w/c"));
    mapper.handle(record("DELETE", "/w/d"));
    mapper.handle(record("CREATE,ISDIR", "/w/e"));
    expect(events.map((e) => [e.type, e.path])).toEqual([
      [EventType.CREATE, "/w/a"],
      [EventType.RENAME, "/w/b"],
      [EventType.CHMOD, "/w/c"],
      [EventType.REMOVE, "/w/d"],
      [EventType.CREATE, "/w/e"],
    ]);
  });

  test("DELETE_SELF is reported for the watched directory only", () => {
    const events: WatchEvent[] = [];
    const mapper = mapperWith(events);
    mapper.handle(record("DELETE_SELF", "/w/sub/"));
    mapper.handle(record("DELETE_SELF", "/w/"));
    expect(events).toEqual([{ type: EventType.REMOVE, path: "/w" }]);
  });

  test("a MODIFY storm is one WRITE now and one trailing WRITE, and CLOSE_WRITE adds none after it", () => {
    vi.useFakeTimers();
    const events: WatchEvent[] = [];
    const mapper = mapperWith(events);
    for (let i = 0; i < 50; i++) mapper.handle(record("MODIFY", "/w/f"));
    expect(events).toHaveLength(1);
    vi.advanceTimersByTime(100);
    expect(events).toHaveLength(2);
    mapper.handle(record("CLOSE_WRITE,CLOSE", "/w/f"));
    expect(events.map((e) => e.type)).toEqual([EventType.WRITE, EventType.WRITE]);
  });

  test("CLOSE_WRITE flushes a pending WRITE at once, and reports one for a write without MODIFY", () => {
    vi.useFakeTimers();
    const events: WatchEvent[] = [];
    const mapper = mapperWith(events);
    mapper.handle(record("MODIFY", "/w/f"));
    mapper.handle(record("MODIFY", "/w/f"));
    mapper.handle(record("CLOSE_WRITE,CLOSE", "/w/f"));
    expect(events.map((e) => e.type)).toEqual([EventType.WRITE, EventType.WRITE]);
    mapper.handle(record("CREATE", "/w/empty"));
    mapper.handle(record("CLOSE_WRITE,CLOSE", "/w/empty"));
    expect(events.slice(2).map((e) => e.type)).toEqual([EventType.CREATE, EventType.WRITE]);
    vi.advanceTimersByTime(1000);
    expect(events).toHaveLength(4);
  });

  test("a pending WRITE is reported before the file's REMOVE", () => {
    vi.useFakeTimers();
    const events: WatchEvent[] = [];
    const mapper = mapperWith(events);
    mapper.handle(record("MODIFY", "/w/f"));
    mapper.handle(record("MODIFY", "/w/f"));
    mapper.handle(record("DELETE", "/w/f"));
    expect(events.map((e) => e.type)).toEqual([EventType.WRITE, EventType.WRITE, EventType.REMOVE]);
  });
});

describe("watch stream plumbing", () => {
  test("Keepalive-Ping-Interval is seconds, defaulting to 90", () => {
    expect(keepaliveIntervalMs("50")).toBe(50_000);
    expect(keepaliveIntervalMs(null)).toBe(90_000);
    expect(keepaliveIntervalMs("nonsense")).toBe(90_000);
    expect(keepaliveIntervalMs("-1")).toBe(90_000);
  });

  test("a full queue drops its oldest items and a failure ends iteration", async () => {
    const queue = new MessageQueue<number>(2);
    queue.push(1);
    queue.push(2);
    queue.push(3);
    expect(queue.dropped).toBe(1);
    const iterator = queue[Symbol.asyncIterator]();
    expect((await iterator.next()).value).toBe(2);
    expect((await iterator.next()).value).toBe(3);
    const next = iterator.next();
    queue.fail(new Error("gone"));
    await expect(next).rejects.toThrow("gone");
  });
});

describe("permission bits", () => {
  const user: SandboxUser = { name: "u", uid: 1000, gid: 1000, home: "/home/u", groups: [1000, 27] };
  const root: SandboxUser = { name: "root", uid: 0, gid: 0, home: "/root", groups: [0] };

  test("owner, then group (supplementary included), then other bits decide", () => {
    expect(mayAccess(user, { mode: 0o600, uid: 1000, gid: 0 }, READ | WRITE)).toBe(true);
    expect(mayAccess(user, { mode: 0o077, uid: 1000, gid: 1000 }, READ)).toBe(false);
    expect(mayAccess(user, { mode: 0o070, uid: 0, gid: 27 }, READ | WRITE | SEARCH)).toBe(true);
    expect(mayAccess(user, { mode: 0o705, uid: 0, gid: 0 }, READ | SEARCH)).toBe(true);
    expect(mayAccess(user, { mode: 0o750, uid: 0, gid: 0 }, SEARCH)).toBe(false);
    expect(mayAccess(root, { mode: 0o000, uid: 5, gid: 5 }, READ | WRITE)).toBe(true);
  });

  test("ancestors are every directory a lookup walks through", () => {
    expect(ancestorsOf("/a/b/c")).toEqual(["/", "/a", "/a/b"]);
    expect(ancestorsOf("/a")).toEqual(["/"]);
  });
});

describe("metadata validation", () => {
  test("keys are lower-cased, empty keys dropped and the first of equal keys kept", () => {
    expect(
      validateMetadata([
        ["Author", "Mish"],
        ["", "x"],
        ["author", "other"],
      ]),
    ).toEqual([["author", "Mish"]]);
  });

  test("non-printable values, over-long keys and oversized totals are invalid_argument", () => {
    expect(() => validateMetadata([["k", "tab\there"]])).toThrow(/printable ASCII/);
    expect(() => validateMetadata([["k".repeat(MAX_METADATA_KEY_BYTES + 1), "v"]])).toThrow(/longer than 246/);
    expect(validateMetadata([["k".repeat(MAX_METADATA_KEY_BYTES), "v"]])).toHaveLength(1);
    expect(() => validateMetadata([["a", "x".repeat(4096)]])).toThrow(/larger than 4096/);
  });
});

describe("download negotiation", () => {
  test("Accept-Encoding follows E2B's preference rules", () => {
    expect(negotiateEncoding(undefined)).toEqual({ coding: "identity", identityAllowed: true });
    expect(negotiateEncoding("gzip, deflate")?.coding).toBe("gzip");
    expect(negotiateEncoding("gzip;q=0.5, identity")?.coding).toBe("identity");
    expect(negotiateEncoding("br")?.coding).toBe("identity");
    expect(negotiateEncoding("*")?.coding).toBe("identity");
    expect(negotiateEncoding("*, identity;q=0")).toEqual({ coding: "gzip", identityAllowed: false });
    expect(negotiateEncoding("br, identity;q=0")).toBeUndefined();
  });

  test("Range headers parse like Go's ServeContent", () => {
    expect(parseRange(undefined, 10)).toEqual({ kind: "full" });
    expect(parseRange("bytes=0-4", 10)).toEqual({ kind: "partial", start: 0, end: 4 });
    expect(parseRange("bytes=5-", 10)).toEqual({ kind: "partial", start: 5, end: 9 });
    expect(parseRange("bytes=-3", 10)).toEqual({ kind: "partial", start: 7, end: 9 });
    expect(parseRange("bytes=-30", 10)).toEqual({ kind: "partial", start: 0, end: 9 });
    expect(parseRange("bytes=8-100", 10)).toEqual({ kind: "partial", start: 8, end: 9 });
    expect(parseRange("bytes=10-", 10)).toEqual({ kind: "unsatisfiable" });
    expect(parseRange("bytes=5-2", 10)).toEqual({ kind: "unsatisfiable" });
    expect(parseRange("items=0-1", 10)).toEqual({ kind: "unsatisfiable" });
    expect(parseRange("bytes=0-1,3-4", 10)).toEqual({ kind: "full" });
  });

  test("Content-Disposition quotes plain names and RFC 5987-encodes others", () => {
    expect(contentDisposition("a.txt")).toBe('inline; filename="a.txt"');
    expect(contentDisposition('we"ird.txt')).toBe("inline; filename*=utf-8''we%22ird.txt");
    expect(contentDisposition("café.txt")).toBe("inline; filename*=utf-8''caf%C3%A9.txt");
  });

  test("Content-Type comes from the extension, else from sniffing", () => {
    expect(contentTypeByExtension("x.html")).toBe("text/html; charset=utf-8");
    expect(contentTypeByExtension("x.PNG")).toBe("image/png");
    expect(contentTypeByExtension("Makefile")).toBeUndefined();
    expect(sniffContentType(Buffer.from("hello\n"))).toBe("text/plain; charset=utf-8");
    expect(sniffContentType(Buffer.from([0x7f, 0x45, 0x4c, 0x46, 0x02, 0x01]))).toBe("application/octet-stream");
  });
});

describe("/files authorization", () => {
  const query = (params: Record<string, string>) => parseFilesQuery(new URLSearchParams(params));

  test("without an access token everything passes", () => {
    expect(() => authorizeFiles(undefined, query({}), "read", undefined)).not.toThrow();
  });

  test("the signature is checked before the expiration, as E2B does", () => {
    const now = 1_700_000_000;
    expect(() =>
      authorizeFiles(undefined, query({ signature: "v1_x", signature_expiration: "1" }), "read", "t", now),
    ).toThrow("invalid signature");
  });

  test("a non-numeric signature_expiration is invalid_argument", () => {
    expect(() => query({ signature_expiration: "soon" })).toThrow(/must be an integer/);
  });
});
