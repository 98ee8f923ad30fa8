#!/usr/bin/env bash
# Installs the OpenID Provider the single sign-on tests and `SAGA_DEMO_SSO=1 make run` start
# (tests/peers/oidc: oidc-provider from npm) from its committed lock file, when its packages are
# missing or older than the lock. One install at a time (parallel test workers may all ask).
set -euo pipefail
cd "$(dirname "$0")/../tests/peers/oidc"
exec 9>.install.lock
flock 9
if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
echo "Installing the test OpenID Provider (tests/peers/oidc, npm ci)" >&2
npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2
