#!/usr/bin/env bash
# `make manage ARGS="create_agent_key --tenant acme --name my-agent"`: manage.py against the
# running `make run` playground, with the environment its web and worker use (DEBUG, SECRET_KEY,
# DATABASE_URL on .data/pg's socket, REDIS_URL on its redis port, SAGA_*), read from the file
# run.sh writes to .data/env. Fails with a sentence when no playground is running.
#
#   scripts/manage.sh create_agent_key --tenant acme --name "my agent"   # arguments with spaces
#   SAGA_RUN_DATA=/tmp/saga-2 make manage ARGS="…"                       # a playground started so
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
DATA=${SAGA_RUN_DATA:-$ROOT/.data}
[[ $DATA == /* ]] || DATA="$(pwd)/$DATA"
if [ ! -d "$DATA" ]; then
  echo "No make run playground is running on $DATA (no such directory). Start one with \`make run\` in another terminal." >&2
  exit 1
fi
DATA=$(cd "$DATA" && pwd)

"$PY" "$ROOT/scripts/devservers.py" status "$DATA" >/dev/null || exit 1
set -a
# shellcheck source=/dev/null
. "$DATA/env"
set +a
exec "$PY" "$ROOT/manage.py" "$@"
