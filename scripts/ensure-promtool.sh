#!/usr/bin/env bash
# Installs Debian's promtool (package prometheus) when it is missing: the tests check the alert rules
# (promtool check rules, promtool test rules) and real scrapes (promtool check metrics) with it.
# The package also ships a Prometheus server, which Debian starts where systemd runs: only the tool
# is wanted here, so a server this script installed is stopped and disabled again at once (one that
# was installed before is never touched: the script exits first).
set -euo pipefail
if [ -x /usr/bin/promtool ]; then
  exit 0
fi
echo "Installing Debian's prometheus package for promtool"
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
/usr/bin/promtool --version | head -1
