"""One operation of the volume content API, confined to one volume's folder.

Usage: volume_fs.py <volume root> <op> <path> <options json>

The process chroots into the volume's folder before it looks at any path: a symlink a sandbox left in the
volume (`/data/x -> /etc`) resolves inside the volume, never on the host, with no check-then-use race. It runs
as root (the api's user) and does one operation:

  stat | list | mkdir | write | read | remove | chmeta

A result is one JSON line on stdout (`read` streams the file's bytes instead); a refusal is one JSON line
{"status": <http status>, "message": ...} on stderr and exit code 3.
"""

import datetime
import errno
import json
import os
import posixpath
import shutil
import stat
import sys

DEFAULT_ID = 9090  # E2B's owner of what the content API creates
CHUNK = 1 << 20


class Refusal(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def iso(seconds):
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def entry(path):
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "unknown"
    out = {
        "name": posixpath.basename(path) if path != "/" else "",
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "atime": iso(st.st_atime),
        "mtime": iso(st.st_mtime),
        "ctime": iso(st.st_ctime),
    }
    if kind == "symlink":
        out["target"] = os.readlink(path)
    return out


def refuse_os_error(error, path):
    if error.errno == errno.ENOENT:
        raise Refusal(404, f"path '{path}' not found")
    if error.errno == errno.ENOTDIR:
        raise Refusal(400, f"a component of '{path}' is not a directory")
    if error.errno == errno.EEXIST:
        raise Refusal(409, f"path '{path}' already exists")
    if error.errno == errno.EISDIR:
        raise Refusal(400, f"path '{path}' is a directory")
    if error.errno == errno.ENOTEMPTY:
        raise Refusal(409, f"directory '{path}' is not empty")
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        raise Refusal(507, f"the volume is full writing '{path}'")
    if error.errno == errno.ENAMETOOLONG:
        raise Refusal(400, f"path '{path}' is too long")
    raise error


def owner(options):
    uid = options.get("uid")
    gid = options.get("gid")
    return (DEFAULT_ID if uid is None else uid, DEFAULT_ID if gid is None else gid)


def make_parents(path, uid, gid):
    """Creates the missing folders above `path`, each owned by uid/gid with mode 0777 (E2B's force)."""
    missing = []
    parent = posixpath.dirname(path)
    while parent != "/" and not os.path.lexists(parent):
        missing.append(parent)
        parent = posixpath.dirname(parent)
    if not os.path.isdir(parent):
        raise Refusal(400, f"a component of '{path}' is not a directory")
    for folder in reversed(missing):
        os.mkdir(folder)
        os.chmod(folder, 0o777)
        os.lchown(folder, uid, gid)


def usage_bytes():
    total = 0
    for folder, dirs, files in os.walk("/"):
        for name in files + dirs:
            try:
                total += os.lstat(posixpath.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


def op_stat(path, _options):
    return entry(path)


def op_list(path, options):
    depth = options.get("depth", 1)
    if not os.path.isdir(path):
        if not os.path.lexists(path):
            raise Refusal(404, f"path '{path}' not found")
        raise Refusal(400, f"path '{path}' is not a directory")
    out = []

    def walk(folder, level):
        for name in sorted(os.listdir(folder)):
            child = posixpath.join(folder, name)
            item = entry(child)
            out.append(item)
            if item["type"] == "directory" and level < depth:
                walk(child, level + 1)

    walk(path, 1)
    return out


def op_mkdir(path, options):
    uid, gid = owner(options)
    mode = options.get("mode", 0o777)
    force = options.get("force", False)
    if os.path.lexists(path):
        if force and os.path.isdir(path) and not os.path.islink(path):
            return entry(path)
        raise Refusal(409, f"path '{path}' already exists")
    parent = posixpath.dirname(path)
    if not os.path.lexists(parent):
        if not force:
            raise Refusal(404, f"parent folder '{parent}' not found")
        make_parents(path, uid, gid)
    os.mkdir(path)
    os.chmod(path, mode)
    os.lchown(path, uid, gid)
    return entry(path)


def read_exactly(count):
    data = b""
    while len(data) < count:
        chunk = sys.stdin.buffer.read(count - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def framed_chunks():
    """The upload as the api frames it: 4-byte big-endian lengths, a 0 length at the end. A stream that stops
    before that end is an interrupted upload (the client went away), never a shorter file."""
    while True:
        header = read_exactly(4)
        if header is None:
            raise Refusal(400, "the upload was interrupted")
        size = int.from_bytes(header, "big")
        if size == 0:
            return
        chunk = read_exactly(size)
        if chunk is None:
            raise Refusal(400, "the upload was interrupted")
        yield chunk


def op_write(path, options):
    """Written to a hidden file next to the target, which takes the target's name only once the whole upload is
    there: a refused or interrupted upload leaves the volume as it was (an existing file keeps its content)."""
    uid, gid = owner(options)
    mode = options.get("mode", 0o666)
    force = options.get("force", False)
    quota = options.get("quotaBytes")
    parent = posixpath.dirname(path)
    if not os.path.lexists(parent):
        if not force:
            raise Refusal(404, f"parent folder '{parent}' not found")
        make_parents(path, uid, gid)
    if not force and os.path.lexists(path):
        raise Refusal(409, f"path '{path}' already exists")
    if os.path.isdir(path) and not os.path.islink(path):
        raise Refusal(400, f"path '{path}' is a directory")
    room = None if quota is None else quota - usage_bytes()
    staging = posixpath.join(parent, f".warren-upload-{os.urandom(6).hex()}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    written = 0
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            for chunk in framed_chunks():
                written += len(chunk)
                if room is not None and written > room:
                    raise Refusal(507, f"the volume's quota of {quota} bytes would be exceeded writing '{path}'")
                out.write(chunk)
        os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
        os.close(fd)
        fd = -1
        if force:
            os.replace(staging, path)
        else:
            # link() fails if the name appeared meanwhile: still an exclusive create.
            os.link(staging, path)
            os.unlink(staging)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        if os.path.lexists(staging):
            os.unlink(staging)
        raise
    return entry(path)


def op_read(path, _options):
    if os.path.isdir(path):
        raise Refusal(400, f"path '{path}' is a directory")
    with open(path, "rb") as source:
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    return None


def op_remove(path, _options):
    if path == "/":
        raise Refusal(400, "the volume's root cannot be removed")
    if not os.path.lexists(path):
        raise Refusal(404, f"path '{path}' not found")
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return None


def op_chmeta(path, options):
    if not os.path.lexists(path):
        raise Refusal(404, f"path '{path}' not found")
    mode = options.get("mode")
    if mode is not None and not os.path.islink(path):
        os.chmod(path, mode)
    uid = options.get("uid")
    gid = options.get("gid")
    if uid is not None or gid is not None:
        os.lchown(path, -1 if uid is None else uid, -1 if gid is None else gid)
    return entry(path)


OPS = {
    "stat": op_stat,
    "list": op_list,
    "mkdir": op_mkdir,
    "write": op_write,
    "read": op_read,
    "remove": op_remove,
    "chmeta": op_chmeta,
}


def main():
    root, op, raw_path, raw_options = sys.argv[1:5]
    os.chroot(root)
    os.chdir("/")
    os.umask(0)
    path = posixpath.normpath("/" + raw_path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    try:
        try:
            result = OPS[op](path, json.loads(raw_options))
        except OSError as error:
            refuse_os_error(error, path)
    except Refusal as refusal:
        sys.stderr.write(json.dumps({"status": refusal.status, "message": str(refusal)}) + "\n")
        sys.exit(3)
    if result is not None:
        sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
