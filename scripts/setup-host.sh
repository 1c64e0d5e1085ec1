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
  # nginx, wrk: the proxy benchmark (npm run bench -w proxy) loads nginx as a reference reverse proxy with wrk.
  nginx wrk
  # The node agent's namespace driver: crun starts sandboxes (user namespace with a uid range, seccomp, no forced
  # no-new-privileges), tini is their PID 1, debootstrap builds templates, iproute2/iptables make the per-sandbox
  # network namespaces and firewall rules.
  crun tini debootstrap iproute2 iptables)
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
