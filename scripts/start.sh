#!/usr/bin/env bash
# Starts a working single-node Warren on this host (as root): private PostgreSQL and Redis under
# .warren/ (or DATABASE_URL / REDIS_URL if set), the master, the api (127.0.0.1:3000), a node agent
# (builds the `base` template on first start, about a minute) and the proxy (127.0.0.1:3002). Creates a
# team and an API key and prints the environment for the e2b SDK (also written to .warren/env).
# Ctrl-C stops everything and removes every sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
[ -d node_modules ] || npm ci --no-audit --no-fund
npm run build
exec node e2e/dist/up.js
