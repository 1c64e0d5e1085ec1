#!/usr/bin/env bash
# Runs Warren's whole test suite on this host (as root): prepares the host, installs the
# locked npm packages, then lint + build + every test (`npm test`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
npm ci --no-audit --no-fund
npm test
