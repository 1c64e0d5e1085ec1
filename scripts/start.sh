#!/usr/bin/env bash
# Starts a working single-node Warren on this host (as root), in the foreground: `warren up`.
# Private PostgreSQL and Redis under .warren/ (or WARREN_DATABASE_URL / WARREN_REDIS_URL if set), the master, the api
# (127.0.0.1:3000), a node agent (the template builder makes `base` on its first start, about two minutes) and the
# proxy (127.0.0.1:3002); creates a team and an API key and prints the environment for the e2b SDK (also
# written to .warren/env). Ctrl-C stops everything and removes every sandbox. Arguments go to `warren up`
# (e.g. --detach, then `node sdk/dist/cli/main.js down`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
[ -d node_modules ] || npm ci --no-audit --no-fund
npm run build
exec node sdk/dist/cli/main.js up "$@"
