#!/usr/bin/env bash
# Prepares this host for Warren's tests and for running envd directly on it (as root):
# the Debian packages envd and its tests use, and the `user` account E2B templates have.
# Idempotent: safe to run on every CI run and by hand.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "setup-host.sh must run as root (it installs packages and creates the 'user' account)" >&2
  exit 1
fi

# sudo: the `user` account uses it (E2B's base template has it).
# inotify-tools: envd's directory watcher (inotifywait). attr: getfattr/setfattr for debugging metadata.
# util-linux: setpriv, which envd uses to drop to a user with their supplementary groups.
# python3-ipykernel ... python3-pexpect: the code gateway's kernels (Python via ipykernel, the bash kernel on
# ipykernel + pexpect, matplotlib/pandas for figures and DataFrames); run with /usr/bin/python3.
packages=(sudo inotify-tools attr util-linux procps
  python3-ipykernel python3-jupyter-client python3-matplotlib python3-matplotlib-inline python3-pandas
  python3-numpy python3-pexpect
  # The code gateway's R kernel (Debian's IRkernel) and Java kernel (jshell from the JDK).
  r-base-core r-cran-irkernel openjdk-17-jdk-headless
  # nginx, wrk: the proxy benchmark (npm run bench -w proxy) loads nginx as a reference reverse proxy with wrk.
  nginx wrk
  # podman: the one-shot sandbox benchmark's peer (npm run bench:oneshot -w e2e), on the same rootfs.
  podman
  # The node agent's namespace driver: crun starts sandboxes (user namespace with a uid range, seccomp, no forced
  # no-new-privileges), tini is their PID 1, debootstrap builds templates, iproute2/iptables make the per-sandbox
  # network namespaces and firewall rules.
  crun tini debootstrap iproute2 iptables
  # openssl: test certificates (the proxy's TLS tests, the E2B_DOMAIN e2e test's CA, the egress tests' HTTPS server).
  openssl
  # The node agent's microvm driver (control-plane/src/runtime/microvm): QEMU's microvm machine and qemu-img for
  # per-sandbox copy-on-write disks, a static busybox and cpio for the guest initramfs, lz4 to unpack the Debian
  # kernel into the ELF vmlinux that PVH boots, e2fsprogs (mkfs.ext4 -d) for guest root images.
  qemu-system-x86 qemu-utils busybox-static cpio lz4 e2fsprogs
  # Templates: skopeo moves images and built templates between registries, OCI layouts and nodes (the template
  # store), umoci unpacks images into root filesystems; docker-registry (the CNCF distribution registry) and
  # apache2-utils (htpasswd) give tests their own registries on loopback.
  skopeo umoci docker-registry apache2-utils
  # chromium: the web console's browser test (e2e/test/console.test.ts drives it headless with playwright-core).
  chromium
  # unzip: the artifact tests check the zips the api makes (e2e/test/artifacts.test.ts, api/artifact-blobs.test.ts).
  unzip
  # gcc, libc6-dev: envd's static command launcher (envd/native/warren-exec.c, built by `npm run build`).
  gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! getent passwd user >/dev/null; then
  useradd --create-home --shell /bin/bash user
fi
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/warren-user
chmod 0440 /etc/sudoers.d/warren-user

# matplotlib builds its font cache on first import (seconds); do it once here, not in the first test's plot.
/usr/bin/python3 -c 'import matplotlib.pyplot' >/dev/null 2>&1 || true

# CRIU 4 for the node agent's checkpoint tier (paused sandboxes released from memory; RUNTIME-NOTES.md §2.8).
# Bookworm's criu 3.17 fails on this kernel (vDSO layout), so Debian trixie's CRIU 4.1 goes into a side root
# and runs with trixie's own loader and libraries (the host's libc is untouched). CRIU 4.1.1 also treats the
# EOPNOTSUPP that Linux >= 6.16 answers for SO_PASSCRED/SO_PASSSEC on TCP sockets as a dump failure
# (checkpoint-restore/criu#2705, fixed after 4.1.1): a tiny preloaded shim answers "off" instead.
# The node agent uses /var/lib/warren/criu/criu when it exists (WARREN_CRIU overrides, "off" disables).
CRIU_DIR=/var/lib/warren/criu
if [ ! -x "$CRIU_DIR/root/usr/sbin/criu" ]; then
  mkdir -p "$CRIU_DIR"
  rm -rf "$CRIU_DIR/root.tmp"
  debootstrap --variant=minbase --include=criu trixie "$CRIU_DIR/root.tmp" "${WARREN_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  mv "$CRIU_DIR/root.tmp" "$CRIU_DIR/root"
fi
if [ ! -f "$CRIU_DIR/sockopt-compat.so" ]; then
  command -v gcc >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev
  cat > "$CRIU_DIR/sockopt-compat.c" <<'C'
/* Linux >= 6.16 refuses SO_PASSCRED/SO_PASSSEC on sockets other than AF_UNIX/NETLINK (EOPNOTSUPP); CRIU 4.1.1
 * fails the dump on it (checkpoint-restore/criu#2705). Report the option as off instead. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
  static int (*real)(int, int, int, void *, socklen_t *);
  if (!real) real = (int (*)(int, int, int, void *, socklen_t *))dlsym(RTLD_NEXT, "getsockopt");
  int ret = real(fd, level, name, val, len);
  if (ret < 0 && errno == EOPNOTSUPP && level == SOL_SOCKET && (name == SO_PASSCRED || name == SO_PASSSEC) &&
      val && len && *len >= sizeof(int)) {
    memset(val, 0, sizeof(int));
    *len = sizeof(int);
    return 0;
  }
  return ret;
}
C
  gcc -O2 -shared -fPIC -o "$CRIU_DIR/sockopt-compat.so" "$CRIU_DIR/sockopt-compat.c" -ldl
fi
cat > "$CRIU_DIR/criu.tmp" <<EOF2
#!/bin/sh
T=$CRIU_DIR/root
exec \$T/lib64/ld-linux-x86-64.so.2 --preload $CRIU_DIR/sockopt-compat.so --library-path \$T/lib/x86_64-linux-gnu:\$T/usr/lib/x86_64-linux-gnu \$T/usr/sbin/criu "\$@"
EOF2
chmod 0755 "$CRIU_DIR/criu.tmp"
mv "$CRIU_DIR/criu.tmp" "$CRIU_DIR/criu"
"$CRIU_DIR/criu" check >/dev/null 2>&1 || echo "warning: 'criu check' failed; paused sandboxes will stay frozen in memory" >&2

# Guest kernel for the microvm driver: Debian's cloud kernel package, unpacked (not installed) under
# /var/lib/warren/microvm/linux; the driver turns vmlinuz into the ELF vmlinux for PVH and takes the virtio modules
# for its initramfs from here (RUNTIME-NOTES.md §3.1). WARREN_MICROVM_KERNEL overrides the path.
MICROVM_LINUX=/var/lib/warren/microvm/linux
if ! ls "$MICROVM_LINUX"/boot/vmlinuz-* >/dev/null 2>&1; then
  kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "$kernel_pkg" >/dev/null 2>&1)
  rm -rf "$MICROVM_LINUX.tmp" && mkdir -p "$MICROVM_LINUX.tmp"
  dpkg -x "$tmp"/linux-image-*.deb "$MICROVM_LINUX.tmp"
  rm -rf "$tmp" "$MICROVM_LINUX" && mv "$MICROVM_LINUX.tmp" "$MICROVM_LINUX"
fi
