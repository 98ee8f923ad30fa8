#!/usr/bin/env bash
# `make run`: Saga Admin with its demo world, in the foreground, until Ctrl-C.
#
# Without DATABASE_URL it starts a real PostgreSQL kept in .data/pg (the pgserver wheel, on a unix
# socket inside that directory); without REDIS_URL a real redis-server kept in .data/redis on a
# free port. Then it migrates, collects static files, loads the demo policies and logins, starts
# the Procfile's web and worker lines, seeds the demo runs through the real API, starts the demo
# agents' live traffic and prints the URL and logins. Ctrl-C stops everything it started, in
# reverse order. Logs: .data/logs/.
#
# Knobs: PORT (exact port for the web; default 8000 or the next free one), DATABASE_URL,
# REDIS_URL, SAGA_DEMO_TRAFFIC=0 (no live demo traffic), SAGA_DEMO_WORLD_SECRET, DEBUG (default 1
# here), SECRET_KEY (default: one generated once and kept in .data/secret-key),
# SAGA_OUTBOUND_ALLOWED_HOSTS (default: the demo world's host:port), SAGA_RESUME_WEBHOOK_SECRET.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$ROOT/.venv/bin:$PATH"
PY="$ROOT/.venv/bin/python"
DATA="$ROOT/.data"
LOGS="$DATA/logs"
mkdir -p "$LOGS" "$DATA/redis"

say() { printf '\033[1m==> %s\033[0m \033[2m(%ss)\033[0m\n' "$*" "$SECONDS"; }

# name:pid of every background process we started, in start order.
procs=()
started_pg=""
stopping=""

stop_all() {
  [ -n "$stopping" ] && return
  stopping=1
  trap '' INT TERM
  echo
  say "Stopping"
  local i entry name pid
  for ((i = ${#procs[@]} - 1; i >= 0; i--)); do
    entry=${procs[$i]}
    name=${entry%%:*}
    pid=${entry##*:}
    if kill -0 "$pid" 2>/dev/null; then
      # Each process leads its own process group (setsid): TERM reaches gunicorn's and rq's
      # children too, and they shut down warm (a running compensation step finishes).
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      if kill -0 "$pid" 2>/dev/null; then
        echo "    $name did not stop within 10s; killing it"
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      fi
      echo "    stopped $name"
    fi
  done
  if [ -n "$started_pg" ]; then
    "$PY" scripts/devservers.py pg-stop "$DATA/pg" >/dev/null 2>&1 && echo "    stopped postgres" || true
  fi
}
trap 'stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

# start NAME COMMAND...: run COMMAND in its own session, output to .data/logs/NAME.log.
start() {
  local name=$1
  shift
  setsid bash -c 'exec "$@"' "$name" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  procs+=("$name:$!")
}

# The command of a Procfile line, so `make run` starts exactly what a deployment starts.
procfile_cmd() {
  sed -n "s/^$1:[[:space:]]*//p" Procfile
}

if [ -z "${DATABASE_URL:-}" ]; then
  say "Starting PostgreSQL in .data/pg"
  DATABASE_URL=$("$PY" scripts/devservers.py pg-start "$DATA/pg" saga_admin)
  started_pg=1
fi

if [ -z "${REDIS_URL:-}" ]; then
  redis_port=$("$PY" scripts/devservers.py free-port 6380)
  say "Starting Redis in .data/redis on port $redis_port"
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$DATA/redis" \
    --appendonly yes --save 60 1 --protected-mode yes
  for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$redis_port" ping >/dev/null || { tail -n 20 "$LOGS/redis.log"; exit 1; }
  REDIS_URL="redis://127.0.0.1:$redis_port/0"
fi

# The demo world's webhook secret: the web (receiver) and the worker (sender) must share it, and
# it must survive restarts because the loaded policies name it. Kept out of the repository.
if [ -z "${SAGA_DEMO_WORLD_SECRET:-}" ]; then
  [ -s "$DATA/demo-world-secret" ] || "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/demo-world-secret"
  SAGA_DEMO_WORLD_SECRET=$(cat "$DATA/demo-world-secret")
fi

# Development mode, said out loud: the settings fail closed (DEBUG off and no SECRET_KEY: nothing
# starts). The playground runs with DEBUG=1 on plain HTTP (no HTTPS redirect, no secure-only
# cookies, also when DEBUG=0 is asked for) and a key of its own, generated once and kept in .data
# so that sessions survive restarts.
export DEBUG="${DEBUG:-1}" SECURE_SSL_REDIRECT="${SECURE_SSL_REDIRECT:-0}"
export SESSION_COOKIE_SECURE="${SESSION_COOKIE_SECURE:-0}" CSRF_COOKIE_SECURE="${CSRF_COOKIE_SECURE:-0}"
if [ -z "${SECRET_KEY:-}" ]; then
  [ -s "$DATA/secret-key" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(50))' >"$DATA/secret-key")
  SECRET_KEY=$(cat "$DATA/secret-key")
fi
export SECRET_KEY

# An explicit PORT is a promise to whoever set it: use it or fail. Otherwise 8000 or the next free.
if [ -n "${PORT:-}" ]; then
  "$PY" - "$PORT" <<'EOF' || { echo "PORT=$PORT is in use; pick another or unset PORT." >&2; exit 1; }
import sys
sys.path.insert(0, "scripts")
from devservers import _port_free
sys.exit(0 if _port_free(int(sys.argv[1])) else 1)
EOF
else
  PORT=$("$PY" scripts/devservers.py free-port 8000)
fi
BASE_URL="http://127.0.0.1:$PORT"
# Fewer gunicorn workers than production by default: a laptop, not a server.
export DATABASE_URL REDIS_URL SAGA_DEMO_WORLD_SECRET PORT WEB_CONCURRENCY="${WEB_CONCURRENCY:-2}"
# The demo's lost agent should be noticed within a minute, not after production's five.
export SAGA_HEARTBEAT_TIMEOUT_S="${SAGA_HEARTBEAT_TIMEOUT_S:-45}"
# A resume_url must reach a public address unless the operator allows its host. The demo world is
# served by this web process, so agents here may point resume_url at it: that port on this machine
# is allowed, and nothing else on it (not Redis, not PostgreSQL).
export SAGA_OUTBOUND_ALLOWED_HOSTS="${SAGA_OUTBOUND_ALLOWED_HOSTS:-127.0.0.1:$PORT,localhost:$PORT}"
# Commands pushed to resume URLs are signed with per-tenant secrets derived from this master
# (`python manage.py resume_secret --tenant acme` prints Acme's); kept in .data like the others.
if [ -z "${SAGA_RESUME_WEBHOOK_SECRET:-}" ]; then
  [ -s "$DATA/resume-secret" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/resume-secret")
  SAGA_RESUME_WEBHOOK_SECRET=$(cat "$DATA/resume-secret")
fi
export SAGA_RESUME_WEBHOOK_SECRET

say "Preparing the database"
"$PY" manage.py migrate --noinput >"$LOGS/migrate.log" 2>&1 || { tail -n 30 "$LOGS/migrate.log"; exit 1; }
"$PY" manage.py collectstatic --noinput >"$LOGS/collectstatic.log" 2>&1 || { tail -n 30 "$LOGS/collectstatic.log"; exit 1; }

say "Loading the demo policies and logins"
"$PY" manage.py seed_demo --url "$BASE_URL" --setup-only

say "Starting web ($BASE_URL) and worker"
start worker bash -c "$(procfile_cmd worker)"
start web bash -c "$(procfile_cmd web)"
"$PY" scripts/devservers.py wait-url "$BASE_URL/healthz" 60 || { tail -n 30 "$LOGS/web.log"; exit 1; }

say "Seeding demo runs through the API (the first time; later starts find them in place)"
"$PY" manage.py seed_demo --url "$BASE_URL" 2>&1 | tee -a "$LOGS/seed.log"

if [ "${SAGA_DEMO_TRAFFIC:-1}" != "0" ]; then
  start demo-agents "$PY" manage.py seed_demo --url "$BASE_URL" --continuous
fi

cat <<EOF

  Saga Admin is running:   $BASE_URL/
  Demo world (the systems the agents change):  $BASE_URL/demo-world/
  API docs:                $BASE_URL/api/v1/docs
  Logs:                    .data/logs/ (web, worker, demo-agents, redis)

  Press Ctrl-C to stop.

EOF

# Stay in the foreground; if any process dies, say which and stop the rest.
while true; do
  for entry in "${procs[@]}"; do
    name=${entry%%:*}
    pid=${entry##*:}
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited unexpectedly; last lines of .data/logs/$name.log:" >&2
      tail -n 30 "$LOGS/$name.log" >&2
      exit 1
    fi
  done
  sleep 2
done
