#!/usr/bin/env bash
# Installs Debian's promtool (package prometheus) when it is missing: the tests check the alert rules
# (promtool check rules, promtool test rules) and real scrapes (promtool check metrics) with it.
# The package also ships a Prometheus server unit; nothing here starts it.
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
/usr/bin/promtool --version | head -1
