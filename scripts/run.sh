#!/usr/bin/env bash
# `make run`: Saga Admin with its demo world, in the foreground, until Ctrl-C.
#
# Without DATABASE_URL it starts a real PostgreSQL kept in .data/pg (the pgserver wheel, on a unix
# socket inside that directory); without REDIS_URL a real redis-server kept in .data/redis on a
# free port. Then it starts the demo MCP server while it migrates and collects static files, loads
# the demo policies and logins, starts the Procfile's web and worker lines, then a saga-mcp gateway
# in front of that server, seeds the demo runs through the real API (one of them an MCP session
# through that gateway), starts the demo agents' live traffic and prints the URLs and logins.
# Ctrl-C (or TERM, or `make stop`) stops everything it started, in reverse order, and exits 0: the
# playground stopped as asked. Logs: .data/logs/.
#
# The demo MCP server's and the gateway's ports are each chosen just before that server starts,
# and nothing is pointed at one until devservers.py wait-own has seen that the socket listening
# there belongs to the process started here: a port another program took first (another
# playground starting at the same moment) is never mistaken for ours; the next free one is tried.
#
# One playground per data directory, checked before anything starts: while a make run holds
# .data/run.lock (an flock the kernel drops when this script dies, however it dies), a second
# start refuses, says where the first one is and how to stop it or run a second one beside it
# (another clone, or SAGA_RUN_DATA + PORT), and starts and stops nothing; it exits 3, which
# `make run` turns into a quiet 0 (the message is the answer; "Error 3" under it read as a crash). A start that finds the
# files of a dead run cleans them up, unless what that run started is still alive (then it refuses
# and `make stop` stops it). An explicit PORT in use refuses before PostgreSQL or Redis start. It
# never stops a server it did not start.
#
# Management commands: it writes the environment its web and worker run with to .data/env (mode
# 600; the secrets as references to their files) and `make manage ARGS="…"` (scripts/manage.sh)
# runs manage.py with it. The file goes away when this script stops.
#
# Knobs: PORT (exact port for the web; default 8000 or the next free one), SAGA_RUN_HOST (the
# address the web listens on: 127.0.0.1 by default, 0.0.0.0 for every interface, or one IPv4
# address of this machine; the demo MCP server and its gateway always listen on 127.0.0.1), DATABASE_URL,
# REDIS_URL, SAGA_RUN_DATA (the data directory; default .data), SAGA_DEMO_TRAFFIC=0 (no live
# demo traffic), SAGA_DEMO_SSO=1 (single sign-on with a local OpenID Provider; only with the web on
# 127.0.0.1), SAGA_DEMO_WORLD_SECRET, DEBUG (default 0: the app's own error pages), SECRET_KEY (default: one
# generated once and kept in .data/secret-key), SAGA_OUTBOUND_ALLOWED_HOSTS (default: the demo
# world's host:port), SAGA_RESUME_WEBHOOK_SECRET, SAGA_METRICS_TOKEN (GET /metrics' bearer token;
# default: one generated once and kept in .data/metrics-token), SAGA_RUN_MCP_PORT (exact port for the
# demo MCP server; default 8765 or the next free one; SAGA_DEMO_MCP_URL is set to its URL),
# SAGA_RUN_GATEWAY_PORT (exact port for its gateway; default the next free one after the server's).
# A port named by PORT, SAGA_RUN_MCP_PORT or SAGA_RUN_GATEWAY_PORT that is in use is refused
# before anything starts.
set -euo pipefail
CALLER_DIR=$(pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PATH="$ROOT/.venv/bin:$PATH"
PY="$ROOT/.venv/bin/python"
DATA=${SAGA_RUN_DATA:-$ROOT/.data}
[[ $DATA == /* ]] || DATA="$CALLER_DIR/$DATA"
mkdir -p "$DATA"
DATA=$(cd "$DATA" && pwd)
LOGS="$DATA/logs"

say() { printf '\033[1m==> %s\033[0m \033[2m(%ss)\033[0m\n' "$*" "$SECONDS"; }

# --- Checks first: nothing below starts a process until both pass. ---------------------------

# One playground per data directory. fd 9 holds the lock until this script exits. The servers,
# web, worker and the foreground loop's sleep get the descriptor closed (9>&-), so what outlives a
# killed run.sh never keeps it "running" (a startup step such as migrate holds it until it ends).
exec 9>>"$DATA/run.lock"
if ! flock -n 9; then
  "$PY" scripts/devservers.py already-running "$DATA"
  exit 3
fi
"$PY" scripts/devservers.py check-leftovers "$DATA" 9>&- || exit 1
printf 'pid=%s\n' "$$" >"$DATA/run.info"
: >"$DATA/run.procs"

# name:pid of every background process we started, in start order.
procs=()
started_pg=""
pg_pid=""
stopping=""

stop_all() {
  [ -n "$stopping" ] && return
  stopping=1
  trap '' INT TERM HUP
  if [ ${#procs[@]} -gt 0 ] || [ -n "$started_pg" ]; then
    echo
    say "Stopping"
  fi
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
  # Only a PostgreSQL this script started: check-leftovers refused to start beside a running one.
  if [ -n "$started_pg" ]; then
    if "$PY" scripts/devservers.py pg-stop "$DATA/pg" >/dev/null 2>&1 9>&-; then echo "    stopped postgres"; fi
  fi
  rm -f "$DATA/env" "$DATA/run.procs" "$DATA/run.info"
}
# Ctrl-C, TERM (`make stop`) and a closed terminal are how a playground is meant to end: once
# everything is stopped, that is a success (0), not the 130 of an interrupted program.
trap 'stop_all; exit 0' INT TERM HUP
trap 'stop_all' EXIT

# The playground serves demo logins whose passwords are published: its web listens on this
# machine only (127.0.0.1) unless SAGA_RUN_HOST asks for every interface (0.0.0.0) or one address
# of this machine. The Procfile's web line binds WEB_BIND_HOST (deployments: 0.0.0.0, its default).
if ! bind=$("$PY" scripts/devservers.py bind-host "${SAGA_RUN_HOST:-127.0.0.1}" 9>&-); then
  echo "Nothing was started." >&2
  exit 1
fi
WEB_BIND_HOST=${bind% *}
url_host=${bind#* }
# The demo identity provider (SAGA_DEMO_SSO=1) signs in its people with any password, and its
# client secret sits in the data directory: a playground that offers it stays on this machine.
if [ "${SAGA_DEMO_SSO:-0}" = "1" ] && [[ $WEB_BIND_HOST != 127.* ]]; then
  echo "SAGA_DEMO_SSO=1 runs only on this machine: its demo identity provider signs anyone in as its" >&2
  echo "admin with any password. Leave SAGA_RUN_HOST unset (127.0.0.1) with it, or leave SAGA_DEMO_SSO off." >&2
  echo "Nothing was started." >&2
  exit 1
fi

# An explicit PORT is a promise to whoever set it: use it or fail. Otherwise 8000 or the next free.
if [ -n "${PORT:-}" ]; then
  if ! "$PY" scripts/devservers.py port-free "$PORT" --host "$WEB_BIND_HOST"; then
    echo "PORT=$PORT is in use by another program (not a make run on $DATA); nothing was started." >&2
    echo "Pick another port, or unset PORT to take 8000 or the next free one." >&2
    exit 1
  fi
else
  PORT=$("$PY" scripts/devservers.py free-port 8000 --host "$WEB_BIND_HOST")
fi
# The demo MCP server's and its gateway's ports, when you name them: the same promise as PORT.
for knob in SAGA_RUN_MCP_PORT SAGA_RUN_GATEWAY_PORT; do
  value=${!knob:-}
  [ -n "$value" ] || continue
  if ! [[ $value =~ ^[0-9]+$ ]] || ((value < 1 || value > 65535)); then
    echo "$knob=$value is not a port number; nothing was started." >&2
    exit 1
  fi
  if [ "$value" = "$PORT" ] || { [ "$knob" = SAGA_RUN_GATEWAY_PORT ] && [ "$value" = "${SAGA_RUN_MCP_PORT:-}" ]; }; then
    echo "$knob=$value is already the port of another server of this make run; nothing was started." >&2
    exit 1
  fi
  if ! "$PY" scripts/devservers.py port-free "$value"; then
    echo "$knob=$value is in use by another program; nothing was started." >&2
    echo "Pick another port, or unset $knob to take the next free one." >&2
    exit 1
  fi
done
BASE_URL="http://$url_host:$PORT"
printf 'url=%s\n' "$BASE_URL" >>"$DATA/run.info"

# --- Start. ------------------------------------------------------------------------------------
mkdir -p "$LOGS" "$DATA/redis"

# The kernel's start time of a pid (field 22 of /proc/PID/stat): with the pid, it names one
# process, so `make stop` after a crash never signals a stranger that reused the pid.
proc_start() {
  local stat fields
  stat=$(<"/proc/$1/stat") || return 0
  read -ra fields <<<"${stat##*) }"
  echo "${fields[19]}"
}

# start NAME COMMAND...: run COMMAND in its own session, output to .data/logs/NAME.log.
start() {
  local name=$1
  shift
  setsid bash -c 'exec "$@"' "$name" "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  procs+=("$name:$!")
  echo "$name $! $(proc_start $!)" >>"$DATA/run.procs"
}

# The pid (session leader) of the process started as NAME.
pid_of() {
  local entry
  for entry in "${procs[@]}"; do [ "${entry%%:*}" != "$1" ] || echo "${entry##*:}"; done
}

# forget NAME: stop the process started as NAME (it lost its port) and strike it from the records.
forget() {
  local pid entry kept=()
  pid=$(pid_of "$1")
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  for entry in "${procs[@]}"; do [ "${entry%%:*}" = "$1" ] || kept+=("$entry"); done
  procs=("${kept[@]}")
  grep -v "^$1 " "$DATA/run.procs" >"$DATA/run.procs.tmp" || true
  mv "$DATA/run.procs.tmp" "$DATA/run.procs"
}

# start_on_port [--no-wait|--started] NAME KNOB FIRST URL_TEMPLATE COMMAND...: start a server on a
# port and wait until the server answering there is the one started here (devservers.py wait-own:
# the listener's socket belongs to its session), not whatever else took the port meanwhile. The
# port is KNOB's value (refused if another program takes it first) or the first free one from
# FIRST, chosen just before the server binds it; a lost race moves on to the next free one. In the
# command and URL_TEMPLATE, @PORT@ stands for the port. Sets $bound_port. --no-wait only starts it
# (at $bound_port), so that other work overlaps its start; the same call with --started then waits.
start_on_port() {
  local mode=wait
  case $1 in --no-wait | --started) mode=${1#--}; shift ;; esac
  local name=$1 knob=$2 first=$3 template=$4 rc port tries
  shift 4
  for tries in 1 2 3 4 5; do
    if [ "$mode" = started ]; then
      port=$bound_port
      mode=wait
    else
      port=${!knob:-}
      [ -n "$port" ] || port=$("$PY" scripts/devservers.py free-port "$first" --except "$PORT" ${SAGA_RUN_MCP_PORT:-} \
        ${SAGA_RUN_GATEWAY_PORT:-} ${taken_ports[@]+"${taken_ports[@]}"} 9>&-)
      start "$name" "${@//@PORT@/$port}"
      bound_port=$port
      [ "$mode" = wait ] || return 0
    fi
    rc=0
    "$PY" scripts/devservers.py wait-own "${template//@PORT@/$port}" "$(pid_of "$name")" 60 9>&- || rc=$?
    if [ "$rc" = 0 ]; then
      taken_ports+=("$port")
      return 0
    fi
    if [ "$rc" = 3 ] && [ -z "${!knob:-}" ]; then
      echo "    ($name: another program took port $port first; trying the next free one)"
      forget "$name"
      first=$((port + 1))
      continue
    fi
    [ "$rc" != 3 ] || echo "$knob=$port: another program took it before $name could; pick another port." >&2
    tail -n 30 "$LOGS/$name.log" >&2
    exit 1
  done
  echo "$name lost its port to another program five times in a row; giving up." >&2
  exit 1
}
taken_ports=()

# The command of a Procfile line, so `make run` starts exactly what a deployment starts.
procfile_cmd() {
  sed -n "s/^$1:[[:space:]]*//p" Procfile
}

# Secrets the environment file names by their file rather than by value: NAME=FILE.
declare -A secret_files=()

if [ -z "${DATABASE_URL:-}" ]; then
  say "Starting PostgreSQL in $DATA/pg"
  started_pg=1
  DATABASE_URL=$("$PY" scripts/devservers.py pg-start "$DATA/pg" saga_admin 9>&-)
  pg_pid=$(head -n1 "$DATA/pg/postmaster.pid")
fi

if [ -z "${REDIS_URL:-}" ]; then
  redis_port=$("$PY" scripts/devservers.py free-port 6380)
  say "Starting Redis in $DATA/redis on port $redis_port"
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$DATA/redis" \
    --appendonly yes --save 60 1 --protected-mode yes
  for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$redis_port" ping >/dev/null || { tail -n 20 "$LOGS/redis.log"; exit 1; }
  REDIS_URL="redis://127.0.0.1:$redis_port/0"
fi

# The MCP demo: the in-memory HR + workspace MCP server (Streamable HTTP), and later saga-mcp in
# front of it recording every call as the agent "mcp-agent". Neither is a part of Saga Admin, so
# neither gets its secrets or its database; the gateway gets its own agent key in its environment
# only (a key on a command line is readable by every user of the machine). Both serve with
# uvicorn, which would take the web's WEB_CONCURRENCY as a number of workers: they do not get it.
# The server needs nothing of Saga Admin, so it starts now, on the port chosen this moment, and
# is checked to be the one answering there (start_on_port) before the setup points the people.*
# tools' MCP compensators at its URL (seed_demo reads SAGA_DEMO_MCP_URL, as `make manage` does
# from .data/env). It starts with Acme's employees (HR_MCP_DIRECTORY=acme), whose titles the MCP
# agent's promotion session changes.
no_server_env=(env -u SECRET_KEY -u SAGA_DEMO_WORLD_SECRET -u SAGA_RESUME_WEBHOOK_SECRET -u DATABASE_URL
  -u REDIS_URL -u WEB_CONCURRENCY -u PORT)
MCP_JOURNAL="$LOGS/mcp-upstream-journal.jsonl"

# The demo world's webhook secret: the web (receiver) and the worker (sender) must share it, and
# it must survive restarts because the loaded policies name it. Kept out of the repository.
if [ -z "${SAGA_DEMO_WORLD_SECRET:-}" ]; then
  [ -s "$DATA/demo-world-secret" ] || "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/demo-world-secret"
  SAGA_DEMO_WORLD_SECRET=$(cat "$DATA/demo-world-secret")
  secret_files[SAGA_DEMO_WORLD_SECRET]="$DATA/demo-world-secret"
fi

# The playground runs as a deployment does (DEBUG off: the app's own 404 and 500 pages, hashed
# static files), on plain HTTP (no HTTPS redirect, no HSTS, no secure-only cookies) and with a key
# of its own, generated once and kept in .data so that sessions survive restarts. DEBUG=1 make run
# gives Django's debug pages instead.
export DEBUG="${DEBUG:-0}" SECURE_SSL_REDIRECT="${SECURE_SSL_REDIRECT:-0}" SECURE_HSTS_SECONDS="${SECURE_HSTS_SECONDS:-0}"
export SESSION_COOKIE_SECURE="${SESSION_COOKIE_SECURE:-0}" CSRF_COOKIE_SECURE="${CSRF_COOKIE_SECURE:-0}"
if [ -z "${SECRET_KEY:-}" ]; then
  [ -s "$DATA/secret-key" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(50))' >"$DATA/secret-key")
  SECRET_KEY=$(cat "$DATA/secret-key")
  secret_files[SECRET_KEY]="$DATA/secret-key"
fi
export SECRET_KEY

# Links in notifications (the demo's console e-mails in .data/logs/worker.log) point here.
export SAGA_PUBLIC_URL="${SAGA_PUBLIC_URL:-$BASE_URL}"
# Two gunicorn worker processes (the Procfile's default too; WEB_THREADS threads each): a laptop.
export DATABASE_URL REDIS_URL SAGA_DEMO_WORLD_SECRET PORT WEB_BIND_HOST WEB_CONCURRENCY="${WEB_CONCURRENCY:-2}"
# Served at one address of this machine (SAGA_RUN_HOST), the app must answer to that host name too.
if [ "$url_host" != 127.0.0.1 ] && [ -z "${ALLOWED_HOSTS:-}" ]; then
  export ALLOWED_HOSTS="localhost,127.0.0.1,[::1],$url_host"
fi
# The demo world (/demo-world/) is served only when SAGA_DEMO is on; make run is the demo.
export SAGA_DEMO=1
# The playground's collected static files live in its data directory, not in the checkout's
# staticfiles/: collectstatic rewrites files in place, and whatever else serves or tests from the
# checkout (the test suite's processes, another make run) must never see one missing meanwhile.
export STATIC_ROOT="${STATIC_ROOT:-$DATA/static}"
# The demo's lost agent should be noticed within a minute, not after production's five.
export SAGA_HEARTBEAT_TIMEOUT_S="${SAGA_HEARTBEAT_TIMEOUT_S:-45}"
# ...and a resume its agent does not pick up is announced before that (production: 180 s).
export SAGA_RESUME_ACK_TIMEOUT_S="${SAGA_RESUME_ACK_TIMEOUT_S:-30}"
# A resume_url must reach a public address unless the operator allows its host. The demo world is
# served by this web process, so agents here may point resume_url at it: that port on this machine
# is allowed, and nothing else on it (not Redis, not PostgreSQL).
export SAGA_OUTBOUND_ALLOWED_HOSTS="${SAGA_OUTBOUND_ALLOWED_HOSTS:-127.0.0.1:$PORT,localhost:$PORT$([ "$url_host" = 127.0.0.1 ] || echo ",$url_host:$PORT")}"
# Commands pushed to resume URLs are signed with per-agent secrets derived from this master
# (`python manage.py resume_secret --tenant acme --agent demo-agents` prints the Acme demo agents');
# kept in .data like the others.
if [ -z "${SAGA_RESUME_WEBHOOK_SECRET:-}" ]; then
  [ -s "$DATA/resume-secret" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/resume-secret")
  SAGA_RESUME_WEBHOOK_SECRET=$(cat "$DATA/resume-secret")
  secret_files[SAGA_RESUME_WEBHOOK_SECRET]="$DATA/resume-secret"
fi
export SAGA_RESUME_WEBHOOK_SECRET
# GET /metrics (Prometheus) answers only with this bearer token (unset, it is 404); kept in .data.
if [ -z "${SAGA_METRICS_TOKEN:-}" ]; then
  [ -s "$DATA/metrics-token" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/metrics-token")
  SAGA_METRICS_TOKEN=$(cat "$DATA/metrics-token")
  secret_files[SAGA_METRICS_TOKEN]="$DATA/metrics-token"
fi
export SAGA_METRICS_TOKEN

# The environment for management commands, exactly as the web and worker get it: what this script
# set, every SAGA_* setting and the other settings' variables you set. Secrets from .data files
# appear as references to those files; a secret you passed in yourself is not written down.
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
write_env() {
  local name names
  names=(DEBUG SECURE_SSL_REDIRECT SECURE_HSTS_SECONDS SESSION_COOKIE_SECURE CSRF_COOKIE_SECURE SECRET_KEY DATABASE_URL REDIS_URL STATIC_ROOT)
  for name in ALLOWED_HOSTS CSRF_TRUSTED_ORIGINS DB_CONN_MAX_AGE LOG_LEVEL RQ_LOG_LEVEL EMAIL_BACKEND \
    DEFAULT_FROM_EMAIL $(compgen -e | grep '^SAGA_' | grep -vx 'SAGA_RUN_DATA\|SAGA_DEMO_TRAFFIC' | sort); do
    if [ -n "${!name+set}" ]; then names+=("$name"); fi
  done
  (
    umask 077
    {
      echo "# The environment of the make run on $DATA ($BASE_URL/, pid $$),"
      echo "# for management commands. Removed when that make run stops. Use it with"
      echo "#   make manage ARGS=\"create_agent_key --tenant acme --name my-agent\""
      echo "# or, in a shell: set -a; . $(shq "$DATA/env"); set +a; python manage.py ..."
      for name in "${names[@]}"; do
        if [ -n "${secret_files[$name]:-}" ]; then
          echo "export $name=\"\$(cat $(shq "${secret_files[$name]}"))\""
        elif [[ $name == *SECRET* ]]; then
          echo "# $name: you passed it to make run; it is not written here. Export it yourself."
        else
          echo "export $name=$(shq "${!name}")"
        fi
      done
    } >"$DATA/env.tmp"
  )
  mv "$DATA/env.tmp" "$DATA/env"
}

# SAGA_DEMO_SSO=1: single sign-on with a local OpenID Provider (tests/peers/oidc, the one the SSO
# tests start: oidc-provider from npm) whose demo people sign in on its own pages, and the web
# configured to use it (docs/OPERATIONS.md, "Single sign-on (OIDC)"). Their groups are in
# .data/oidc-accounts.json, read again at every sign-in.
if [ "${SAGA_DEMO_SSO:-0}" = "1" ]; then
  say "Starting a local OpenID Provider for single sign-on (SAGA_DEMO_SSO=1)"
  bash scripts/ensure-oidc-peer.sh 9>&-
  oidc_port=$("$PY" scripts/devservers.py free-port 9400 --except "$PORT" ${SAGA_RUN_MCP_PORT:-} ${SAGA_RUN_GATEWAY_PORT:-})
  [ -s "$DATA/oidc-client-secret" ] || (umask 077 && "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DATA/oidc-client-secret")
  [ -s "$DATA/oidc-accounts.json" ] || cat >"$DATA/oidc-accounts.json" <<'JSON'
{
  "ada": {"name": "Ada Admin", "preferred_username": "ada", "email": "ada@example.com", "groups": ["saga:acme:admin"]},
  "olga": {"name": "Olga Operator", "preferred_username": "olga", "email": "olga@example.com", "groups": ["saga:acme:operator"]},
  "avery": {"name": "Avery Approver", "preferred_username": "avery", "email": "avery@example.com", "groups": ["saga:acme:approver"]},
  "nobody": {"name": "No Role", "preferred_username": "nobody", "email": "nobody@example.com", "groups": ["wiki-readers"]}
}
JSON
  start oidc-provider env -i PATH="$PATH" HOME="${HOME:-/tmp}" OIDC_PEER_PORT="$oidc_port" \
    OIDC_PEER_CLIENT_ID=saga-admin-demo OIDC_PEER_CLIENT_SECRET="$(cat "$DATA/oidc-client-secret")" \
    OIDC_PEER_REDIRECT_URIS="$BASE_URL/oidc/callback/,http://localhost:$PORT/oidc/callback/" \
    OIDC_PEER_ACCOUNTS="$DATA/oidc-accounts.json" node tests/peers/oidc/provider.mjs
  export SAGA_OIDC_ISSUER="http://127.0.0.1:$oidc_port" SAGA_OIDC_CLIENT_ID=saga-admin-demo
  export SAGA_OIDC_SCOPES="openid email profile groups" SAGA_OIDC_PROVIDER_NAME="the demo identity provider"
  SAGA_OIDC_CLIENT_SECRET=$(cat "$DATA/oidc-client-secret")
  secret_files[SAGA_OIDC_CLIENT_SECRET]="$DATA/oidc-client-secret"
  export SAGA_OIDC_CLIENT_SECRET
  "$PY" scripts/devservers.py wait-url "$SAGA_OIDC_ISSUER/.well-known/openid-configuration" 30 || { tail -n 30 "$LOGS/oidc-provider.log"; exit 1; }
fi

say "Preparing the database and starting the demo MCP server"
mcp_server=(mcp-upstream SAGA_RUN_MCP_PORT 8765 "http://127.0.0.1:@PORT@/mcp" "${no_server_env[@]}" "$PY"
  clients/python/examples/hr_workspace_mcp.py --http "127.0.0.1:@PORT@")
HR_MCP_JOURNAL="$MCP_JOURNAL" HR_MCP_DIRECTORY=acme start_on_port --no-wait "${mcp_server[@]}"
"$PY" manage.py migrate --noinput >"$LOGS/migrate.log" 2>&1 || { tail -n 30 "$LOGS/migrate.log"; exit 1; }
"$PY" manage.py collectstatic --noinput >"$LOGS/collectstatic.log" 2>&1 || { tail -n 30 "$LOGS/collectstatic.log"; exit 1; }
HR_MCP_JOURNAL="$MCP_JOURNAL" HR_MCP_DIRECTORY=acme start_on_port --started "${mcp_server[@]}"
mcp_port=$bound_port
export SAGA_DEMO_MCP_URL="http://127.0.0.1:$mcp_port/mcp"
write_env

say "Loading the demo policies and logins"
"$PY" manage.py seed_demo --url "$BASE_URL" --setup-only

say "Starting web ($BASE_URL) and worker"
start worker bash -c "$(procfile_cmd worker)"
start web bash -c "$(procfile_cmd web)"
"$PY" scripts/devservers.py wait-url "$BASE_URL/healthz" 60 || { tail -n 30 "$LOGS/web.log"; exit 1; }

say "Starting the saga-mcp gateway in front of the demo MCP server ($SAGA_DEMO_MCP_URL)"
mcp_key=$("$PY" manage.py seed_demo --print-key acme-mcp-gateway)
SAGA_API_KEY="$mcp_key" start_on_port mcp-gateway SAGA_RUN_GATEWAY_PORT $((mcp_port + 1)) \
  "http://127.0.0.1:@PORT@/mcp" "${no_server_env[@]}" saga-mcp --saga-url "$BASE_URL" \
  --upstream "$SAGA_DEMO_MCP_URL" --listen "127.0.0.1:@PORT@" --namespace people --agent mcp-agent
mcp_key=""
MCP_GATEWAY_URL="http://127.0.0.1:$bound_port/mcp"

say "Seeding demo runs through the API (the first time; later starts find them in place)"
# --no-setup: the setup ran a moment ago (--setup-only, above); doing it again only costs seconds.
"$PY" manage.py seed_demo --url "$BASE_URL" --no-setup --mcp-gateway "$MCP_GATEWAY_URL" 2>&1 | tee -a "$LOGS/seed.log"

if [ "${SAGA_DEMO_TRAFFIC:-1}" != "0" ]; then
  start demo-agents "$PY" manage.py seed_demo --url "$BASE_URL" --no-setup --continuous
fi

metrics_token="\$SAGA_METRICS_TOKEN"  # the one you passed
[ -z "${secret_files[SAGA_METRICS_TOKEN]:-}" ] || metrics_token="\$(cat $DATA/metrics-token)"
manage="make manage"
[ "$DATA" = "$ROOT/.data" ] || manage="SAGA_RUN_DATA=$DATA make manage"
cat <<EOF

  Saga Admin is running:   $BASE_URL/
  Demo world (the systems the agents change):  $BASE_URL/demo-world/
  API docs:                $BASE_URL/api/v1/docs
  Prometheus metrics:      curl -H "Authorization: Bearer $metrics_token" $BASE_URL/metrics
                           (docs/OPERATIONS.md, "Metrics and alerts"; the charts page is $BASE_URL/insights/)
  MCP gateway (saga-mcp):  $MCP_GATEWAY_URL  (Streamable HTTP: point an MCP host or mcp.Client at it;
                           its calls are the tools people.*, its sessions runs of mcp-agent; docs/MCP.md, "The demo under make run")
  Demo MCP server:         $SAGA_DEMO_MCP_URL  (what reached it: $MCP_JOURNAL)
  Logs:                    $LOGS/ (web, worker, demo-agents, mcp-upstream, mcp-gateway, redis)
  Notifications:           Acme's on-call e-mails are printed to $LOGS/worker.log (console e-mail backend)
$(if [ "$WEB_BIND_HOST" = 127.0.0.1 ]; then echo "  Listening on:            127.0.0.1 only (SAGA_RUN_HOST=0.0.0.0 make run: every interface)"; else echo "  Listening on:            $WEB_BIND_HOST (SAGA_RUN_HOST): other machines can reach it, and the demo logins' passwords are published"; fi)
$(if [ "${SAGA_DEMO_TRAFFIC:-1}" != "0" ]; then echo "  Live demo traffic:       a new run every 20 s; about 1 in 5 fails into the recovery queue (SAGA_DEMO_TRAFFIC=0 make run: none)"; fi)
  Management commands:     $manage ARGS="create_agent_key --tenant acme --name my-agent" (env: $DATA/env)
$(if [ "${SAGA_DEMO_SSO:-0}" = "1" ]; then printf '%s\n' "  Single sign-on:          \"Sign in with the demo identity provider\" on $BASE_URL/login/, then on its own page" "                           as ada (Acme admin), olga (operator), avery (approver) or nobody (no role), any password;" "                           their groups: $DATA/oidc-accounts.json (read at every sign-in; provider $SAGA_OIDC_ISSUER)"; fi)

  Press Ctrl-C to stop.

EOF

# Stay in the foreground; if any process dies, say which and stop the rest.
while true; do
  for entry in "${procs[@]}"; do
    name=${entry%%:*}
    pid=${entry##*:}
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited unexpectedly; last lines of $LOGS/$name.log:" >&2
      tail -n 30 "$LOGS/$name.log" >&2
      exit 1
    fi
  done
  if [ -n "$pg_pid" ] && ! kill -0 "$pg_pid" 2>/dev/null; then
    echo "PostgreSQL (pid $pg_pid) exited unexpectedly; last lines of $DATA/pg/log:" >&2
    tail -n 30 "$DATA/pg/log" >&2 || true
    exit 1
  fi
  sleep 2 9>&-
done
