#!/usr/bin/env bash
# Runs Warren's whole test suite on this host (as root): prepares the host, makes sure the machine's
# PostgreSQL (127.0.0.1:5432, database `test`) and Redis (127.0.0.1:6379) that the tests use are running,
# installs the locked npm packages, then lint + build + every test (`npm test`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "test.sh: starting Redis on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "test.sh: starting PostgreSQL on 127.0.0.1:5432"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort | tail -n 1)" main start
fi
for _ in $(seq 50); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 0.2; done
runuser -u postgres -- psql -h 127.0.0.1 -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 ||
  runuser -u postgres -- createdb -h 127.0.0.1 test

npm ci --no-audit --no-fund
status=0
npm test || status=$?
# Which pause tier this run covered: the memory path (CRIU checkpoints, memory snapshots, moves) runs only where
# the node agent's probe saw CRIU dump and restore (runtime/namespace/criu-probe.ts).
echo "test.sh: CRIU on this host: $(cat /var/lib/warren/criu/probe.json 2>/dev/null || echo 'not probed')"
exit "$status"
