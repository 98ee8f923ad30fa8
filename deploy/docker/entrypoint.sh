#!/bin/sh
# The image's one entrypoint (and what tests/test_install.py starts, from the folder
# deploy/docker/install.sh filled):
#   web       the Procfile's web line (gunicorn on ${PORT:-8000})
#   worker    the Procfile's worker line (the RQ worker with its scheduler, every queue)
#   migrate   as the owner (DATABASE_URL: the role that owns the tables): migrate the database,
#             grant the application's role (the user of SAGA_APP_DATABASE_URL, the web's and the
#             worker's DATABASE_URL; created if missing and the owner may) what it needs and no
#             more (db_grants --apply --create), then bootstrap from SAGA_BOOTSTRAP_* (idempotent;
#             nothing without them): what the Compose one-shot service and the Kubernetes Job run
#   anything else: a management command, e.g. `create_agent_key --tenant acme --name bot`
# The web and worker commands are read from the Procfile beside this script, so the image, a PaaS
# and `make run` start the same commands.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
PATH="$here/venv/bin:$PATH"
export PATH

procfile_line() {
    line=$(sed -n "s/^$1: //p" "$here/Procfile")
    if [ -z "$line" ]; then
        echo "entrypoint: no '$1:' line in $here/Procfile" >&2
        exit 1
    fi
    printf '%s' "$line"
}

command=${1:-web}
[ "$#" -gt 0 ] && shift
# What this container runs, in the main process's environment: the image's HEALTHCHECK
# (python -m saga_admin.probe) reads it to check the web as a web and the worker as a worker.
SAGA_PROCESS=$command
export SAGA_PROCESS

case "$command" in
    web | worker)
        line=$(procfile_line "$command")
        # The line's own ${VAR:-default} expansions happen here, as a Procfile runner does them.
        exec /bin/sh -c "exec $line \"\$@\"" "$command" "$@"
        ;;
    migrate)
        python -m saga_admin migrate --noinput "$@"
        if [ -n "${SAGA_APP_DATABASE_URL:-}${SAGA_APP_DATABASE_URL_FILE:-}" ]; then
            python -m saga_admin db_grants --apply --create
        else
            # One role for everything: it owns the audit log, so the web and the worker could
            # disable its triggers. Said on every release, not refused, for the setups built so.
            echo "entrypoint: SAGA_APP_DATABASE_URL is not set: no grants for an application role;" \
                "the web and worker run as the owner of the audit log (docs/DEPLOY.md," \
                "\"The database roles\")" >&2
        fi
        exec python -m saga_admin bootstrap
        ;;
    *)
        exec python -m saga_admin "$command" "$@"
        ;;
esac
