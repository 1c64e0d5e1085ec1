#!/usr/bin/env bash
# Starts what Warren has today on this host (as root): envd on 127.0.0.1:49983, default user
# `user`. Point the official SDK at it with E2B_DEBUG=true. Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
[ -d node_modules ] || npm ci --no-audit --no-fund
npm run build
exec node --max-semi-space-size=1 envd/dist/envd.mjs --port "${ENVD_PORT:-49983}" --default-user user
