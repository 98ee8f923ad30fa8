#!/usr/bin/env bash
# Installs Debian's PgBouncer for the tests that run the product behind it in transaction pooling
# mode (tests/support/pgbouncer.py starts its own; the package's system service is not used).
set -euo pipefail
if [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
echo "Installing Debian's pgbouncer for the connection pooler tests"
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq pgbouncer >/dev/null
/usr/sbin/pgbouncer --version | head -1
