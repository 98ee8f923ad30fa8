#!/bin/sh
# Installs the server as the container image runs it, into PREFIX:
#   PREFIX/venv     a virtualenv with the server installed from SOURCE (pip install, not editable),
#                   its dependencies at SOURCE/constraints.txt's versions
#   PREFIX/static   the static files, collected (hashed, with their manifest)
#   PREFIX/Procfile the web and worker commands, which PREFIX/entrypoint.sh reads
# The Dockerfile's build stage runs it, and tests/test_install.py runs it too, into a fresh folder
# on this machine, then starts the processes through the entrypoint: what the image does is
# tested here although this machine has no container engine.
#
#   sh deploy/docker/install.sh SOURCE PREFIX      (PYTHON names the interpreter; python3 if unset)
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: install.sh SOURCE PREFIX" >&2
    exit 2
fi
source_dir=$(cd "$1" && pwd)
prefix=$2
python=${PYTHON:-python3}

mkdir -p "$prefix"
"$python" -m venv "$prefix/venv"
# Every runtime dependency at the version the suite ran against (constraints.txt, `make lock`):
# the image installs what was tested, not whatever the ranges allow on the day it is built.
"$prefix/venv/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --quiet \
    --constraint "$source_dir/constraints.txt" "$source_dir"

# collectstatic signs nothing, but the settings refuse to load without a SECRET_KEY (fail closed):
# a throwaway one, for this command only. Run from / so nothing of SOURCE is on the path: the
# static sources come from the installed packages, as they will at run time.
(
    cd /
    DJANGO_SETTINGS_MODULE=saga_admin.settings DEBUG=0 SECRET_KEY=collectstatic-signs-nothing \
        STATIC_ROOT="$prefix/static" "$prefix/venv/bin/python" -m django collectstatic --noinput -v0
)

cp "$source_dir/Procfile" "$prefix/Procfile"
cp "$source_dir/deploy/docker/entrypoint.sh" "$prefix/entrypoint.sh"
chmod 0755 "$prefix/entrypoint.sh"
