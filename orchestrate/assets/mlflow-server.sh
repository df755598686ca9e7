#!/usr/bin/env bash
# Starts an MLflow tracking server for a sweep: the place every SLURM job of the sweep logs to, and the dashboard.
# Runs on the login node (or any machine the compute nodes can reach). Bound to 127.0.0.1 unless --host names
# another address; jobs on other nodes need --host 0.0.0.0 (or the node's cluster address).
#
# Bound beyond loopback, the server takes only its owner's credentials (MLflow's basic-auth app): nobody else on
# the network can read or write a sweep's ledger. The first start under DIR makes the admin user (your login name)
# with a random password, keeps the auth config, database and a copy of the credentials in DIR (0600), and writes
# the credentials to ~/.mlflow/credentials (0600), where every MLflow client (jobs, orchestrate, analysis) finds
# them; home is shared by login and compute nodes. MLFLOW_TRACKING_USERNAME/PASSWORD, when set, win over that file.
# The password is never put on a command line or in a log; a second server of yours reuses it.
#
# Usage: slurm/mlflow-server.sh [options]    (installed: asr-study mlflow-server [options])
#   --dir DIR                 where the database, artifacts, log and pid file live (default: ./mlflow-server)
#   --backend-store-uri URI   tracking store (default: sqlite:///DIR/mlflow.db); e.g. postgresql://user@host/db
#   --artifacts-destination P where the server stores artifacts (default: DIR/artifacts)
#   --host HOST               address to bind (default: 127.0.0.1)
#   --port PORT               port (default: 5000)
#   --workers N               server worker processes (default: 4)
#   --allowed-hosts LIST      Host headers the server accepts; default when --host is not local: this machine's
#                             names and addresses, localhost and private networks
#   --credentials-file PATH   where the clients' credentials go (default: ~/.mlflow/credentials); an existing file
#                             that holds another user's credentials is never overwritten
#   --no-auth                 no credentials on a non-loopback --host: anyone who reaches the port can read and
#                             write every ledger on it. Only for a network where that is acceptable
#   --detach                  run in the background, wait until /health answers, print the URI and return
#   --stop                    stop the server started with --detach under DIR
#   -h, --help                this text
# Environment: MLFLOW (the mlflow executable; default: the repository's .venv, then PATH; asr-study mlflow-server
#   sets it to its own environment's),
#   MLFLOW_SERVER_DIR (default for --dir), MLFLOW_SERVER_TIMEOUT (seconds --detach waits for /health; 120),
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION (MLflow's GenAI job runner; default false here)
# The first line on stdout is the URI to give to jobs and to `orchestrate submit --tracking-uri`:
#   MLFLOW_TRACKING_URI=http://HOST:PORT
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { printf 'mlflow-server.sh: error: %s\n' "$*" >&2; exit 2; }

DIR=${MLFLOW_SERVER_DIR:-./mlflow-server}
BACKEND= ARTIFACTS= HOST=127.0.0.1 PORT=5000 WORKERS=4 ALLOWED= DETACH=0 STOP=0 NO_AUTH=0 CREDS=
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=${2:?--dir needs a value}; shift 2 ;;
    --backend-store-uri) BACKEND=${2:?--backend-store-uri needs a value}; shift 2 ;;
    --artifacts-destination) ARTIFACTS=${2:?--artifacts-destination needs a value}; shift 2 ;;
    --host) HOST=${2:?--host needs a value}; shift 2 ;;
    --port) PORT=${2:?--port needs a value}; shift 2 ;;
    --workers) WORKERS=${2:?--workers needs a value}; shift 2 ;;
    --allowed-hosts) ALLOWED=${2:?--allowed-hosts needs a value}; shift 2 ;;
    --credentials-file) CREDS=${2:?--credentials-file needs a value}; shift 2 ;;
    --no-auth) NO_AUTH=1; shift ;;
    --detach) DETACH=1; shift ;;
    --stop) STOP=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[[ $PORT =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || die "--port '$PORT' is not a port number (1-65535)"
[[ $WORKERS =~ ^[0-9]+$ ]] && [ "$WORKERS" -ge 1 ] || die "--workers '$WORKERS' is not a positive integer"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PIDFILE=$DIR/server.pid
LOGFILE=$DIR/server.log

# The pid file names the process group leader (started with setsid); the workers are in its group.
server_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid=$(tr -dc '0-9' <"$PIDFILE")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'mlflow.* server' &&
    printf '%s' "$pid"
}

if [ $STOP = 1 ]; then
  if pid=$(server_pid); then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    [ -d "/proc/$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
    echo "stopped the MLflow server (pid $pid) under $DIR" >&2
  else
    echo "no MLflow server of $DIR is running" >&2
  fi
  rm -f "$PIDFILE"
  exit 0
fi

MLFLOW=${MLFLOW:-}
if [ -z "$MLFLOW" ]; then
  # the checkout's .venv, seen from slurm/mlflow-server.sh or from where the file lives (orchestrate/assets/)
  here=$(dirname "${BASH_SOURCE[0]}") real=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
  for repo_venv in "$here/../.venv/bin/mlflow" "$real/../../.venv/bin/mlflow"; do
    [ -x "$repo_venv" ] && { MLFLOW=$(cd "$(dirname "$repo_venv")" && pwd)/mlflow; break; }
  done
  [ -n "$MLFLOW" ] || MLFLOW=$(command -v mlflow || true)
fi
[ -n "$MLFLOW" ] && [ -x "$MLFLOW" ] || die "no mlflow executable found (set MLFLOW=/path/to/mlflow or run scripts/setup.sh)"

BACKEND=${BACKEND:-sqlite:///$DIR/mlflow.db}
ARTIFACTS=${ARTIFACTS:-$DIR/artifacts}
# A database server needs its driver in mlflow's Python (PostgreSQL: `pip install -e '.[postgres]'`). Checked here,
# before anything starts, rather than found in the server log; the URI (it may hold a password) goes by environment.
if [[ $BACKEND =~ ^(postgresql|postgres|mysql|mssql)(\+[a-z0-9_]+)?:// ]]; then
  read -r shebang <"$MLFLOW" || true
  py=${shebang#\#!}
  if [ -x "$py" ] && ! why=$(MLFLOW_SERVER_CHECK_URI=$BACKEND "$py" -c '
import os, sys
try:
    import sqlalchemy
    sqlalchemy.create_engine(os.environ["MLFLOW_SERVER_CHECK_URI"])
except ImportError as e:
    sys.exit(f"its driver is not installed in {sys.prefix} ({e})")
except Exception as e:
    sys.exit(f"SQLAlchemy cannot use it ({type(e).__name__}: {e})")
' 2>&1); then
    die "--backend-store-uri: $why; for PostgreSQL run \`pip install -e '.[postgres]'\` (psycopg 3, which postgresql:// URIs use)"
  fi
fi
case $HOST in
  127.0.0.1 | localhost | ::1) URI_HOST=$HOST ;;
  0.0.0.0 | ::) URI_HOST=$(hostname -f 2>/dev/null || hostname) ;;
  *) URI_HOST=$HOST ;;
esac
[[ $URI_HOST == *:* ]] && URI_HOST="[$URI_HOST]"
URI=http://$URI_HOST:$PORT

# MLflow's job execution (GenAI judges and trace jobs: a job runner and seven huey consumers) has no use in a
# training sweep's ledger; off unless asked for, it saves a third of the start-up and their memory.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
# Each worker serves up to 40 requests at once (anyio's thread limit) from a pool of 5+10 database connections; a
# request that waits 30 s for one fails with HTTP 400, which clients do not retry (64 trainers on a busy machine got
# 46 such failures in 120 s: python -m orchestrate.tools.loadtest). With a connection for every thread, sqlite's own lock
# does the waiting and answers a contended write with 503, which MLflow's client retries. sqlite only: a database
# server's connection limit is shared by all workers.
if [[ $BACKEND == sqlite:* ]]; then
  export MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=${MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW:-35}
fi

args=(server --backend-store-uri "$BACKEND" --artifacts-destination "$ARTIFACTS" --serve-artifacts
  --host "$HOST" --port "$PORT" --workers "$WORKERS")
if [ -z "$ALLOWED" ] && [ "$URI_HOST" != 127.0.0.1 ] && [ "$URI_HOST" != localhost ] && [ "$URI_HOST" != "[::1]" ]; then
  # MLflow rejects requests whose Host header it does not know (DNS-rebinding protection); jobs on other nodes
  # address this machine by name, so its names and addresses are added to the default set.
  names=("$(hostname -s)" "$(hostname -f 2>/dev/null || hostname)" "$HOST")
  read -r -a addrs <<<"$(hostname -I 2>/dev/null || true)"
  ALLOWED="localhost,localhost:*,127.0.0.1,127.0.0.1:*,10.*,192.168.*,172.*"
  for n in "${names[@]}" "${addrs[@]}"; do ALLOWED+=",$n,$n:$PORT"; done
fi
[ -n "$ALLOWED" ] && args+=(--allowed-hosts "$ALLOWED")

DIR_CREDS=$DIR/credentials
if pid=$(server_pid); then
  echo "MLFLOW_TRACKING_URI=$URI"
  echo "an MLflow server of $DIR is already running (pid $pid); log: $LOGFILE" >&2
  [ -f "$DIR_CREDS" ] && echo "its credentials (when it was started with them): $DIR_CREDS" >&2
  exit 0
fi

# --- credentials (a non-loopback bind) ---------------------------------------------------------------------------
# Secrets travel only through files (0600, written under umask 077) and bash builtins, never through a command's
# arguments (visible to every user in ps) or a log.

# ini_get FILE KEY: the value of KEY in FILE's [mlflow] section, as Python's configparser reads it.
ini_get() {
  local line section= key value
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    if [[ $line =~ ^[[:space:]]*\[(.*)\][[:space:]]*$ ]]; then section=${BASH_REMATCH[1]}; continue; fi
    [ "$section" = mlflow ] || continue
    if [[ $line =~ ^[[:space:]]*([^=:[:space:]]+)[[:space:]]*[=:][[:space:]]*(.*)$ ]]; then
      key=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
      if [ "${key,,}" = "$2" ]; then printf '%s' "${value%"${value##*[![:space:]]}"}"; return 0; fi
    fi
  done <"$1"
  return 1
}

# write_private FILE: stdin into FILE, readable by the user only, replaced atomically.
write_private() {
  (umask 077 && mkdir -p "$(dirname "$1")" && cat >"$1.tmp.$$" && chmod 600 "$1.tmp.$$" && mv -f "$1.tmp.$$" "$1")
}

credentials_ini() {
  printf '[mlflow]\nmlflow_tracking_username = %s\nmlflow_tracking_password = %s\n' "$AUTH_USER" "$PASSWORD"
}

is_loopback() { case $1 in 127.* | localhost | ::1 | '[::1]') return 0 ;; *) return 1 ;; esac; }

AUTH=0
if ! is_loopback "$HOST"; then
  if [ $NO_AUTH = 1 ]; then
    {
      echo "mlflow-server.sh: WARNING: --no-auth: the server on $HOST:$PORT takes NO credentials. Anyone who can"
      echo "mlflow-server.sh: WARNING: reach that port can read, change and delete every sweep's ledger on it."
      echo "mlflow-server.sh: WARNING: use it only on a network where that is acceptable."
    } >&2
  else
    AUTH=1
  fi
fi

if [ $AUTH = 1 ]; then
  AUTH_USER=$(id -un)
  AUTH_INI=$DIR/basic_auth.ini
  AUTH_DB=$DIR/basic_auth.db
  SECRET_FILE=$DIR/flask-secret-key
  CREDS=${CREDS:-$HOME/.mlflow/credentials}
  [[ $CREDS == /* ]] || CREDS=$PWD/$CREDS
  # The password: the one this server was set up with, else the one in the user's credentials (one password for
  # all of a user's servers, so that one credentials file serves them all), else a new random one.
  if [ -f "$DIR_CREDS" ]; then
    user=$(ini_get "$DIR_CREDS" mlflow_tracking_username) || user=
    PASSWORD=$(ini_get "$DIR_CREDS" mlflow_tracking_password) || PASSWORD=
    [ "$user" = "$AUTH_USER" ] && [ ${#PASSWORD} -ge 12 ] ||
      die "$DIR_CREDS does not hold user '$AUTH_USER' with a password (the server under $DIR is '${user:-nobody}'s); start yours with another --dir"
  elif [ -s "$AUTH_DB" ]; then
    die "the auth database $AUTH_DB exists but its credentials $DIR_CREDS are gone: restore that file, or remove $AUTH_DB to set the server up with new credentials"
  elif [ -f "$CREDS" ] && [ "$(ini_get "$CREDS" mlflow_tracking_username)" = "$AUTH_USER" ] &&
    PASSWORD=$(ini_get "$CREDS" mlflow_tracking_password) && [ ${#PASSWORD} -ge 12 ]; then
    :
  else
    PASSWORD=$(head -c 48 /dev/urandom | base64 -w 0 | tr -dc 'A-Za-z0-9')
  fi
  # The clients' credentials file: written when absent or holding this user; another's is left alone.
  if [ -f "$CREDS" ]; then
    user=$(ini_get "$CREDS" mlflow_tracking_username) || user=
    if [ "$user" != "$AUTH_USER" ]; then
      holder="user '$user'"
      [ -n "$user" ] || holder="no user"
      die "$CREDS holds other credentials ($holder) than this server's (user '$AUTH_USER'); it is left as it is. Start the server with --credentials-file PATH to write its credentials there, then, in your shell and in the profile's job setup: export MLFLOW_TRACKING_USERNAME=$AUTH_USER MLFLOW_TRACKING_PASSWORD=\$(sed -n 's/^mlflow_tracking_password *= *//p' PATH)"
    fi
    if [ "$(ini_get "$CREDS" mlflow_tracking_password)" != "$PASSWORD" ]; then
      echo "mlflow-server.sh: replacing the password in $CREDS with this server's; servers set up with the old one no longer match it" >&2
      credentials_ini | write_private "$CREDS"
    fi
  else
    credentials_ini | write_private "$CREDS"
  fi
  [ -f "$DIR_CREDS" ] || credentials_ini | write_private "$DIR_CREDS"
  [ -s "$SECRET_FILE" ] || head -c 48 /dev/urandom | base64 -w 0 | write_private "$SECRET_FILE"
  # NO_PERMISSIONS: a user other than the admin reads and writes nothing. The credential cache spares each request
  # a scrypt hash (tens of ms of CPU; hundreds of trainers log several times a second).
  {
    echo "[mlflow]"
    echo "default_permission = NO_PERMISSIONS"
    echo "database_uri = sqlite:///$AUTH_DB"
    echo "admin_username = $AUTH_USER"
    echo "admin_password = $PASSWORD"
    echo "authorization_function = mlflow.server.auth:authenticate_request_basic_auth"
    echo "grant_default_workspace_access = false"
    echo "auth_cache_ttl_seconds = 600"
  } | write_private "$AUTH_INI"
  (umask 077 && : >>"$AUTH_DB") && chmod 600 "$DIR_CREDS" "$SECRET_FILE" "$AUTH_DB"
  export MLFLOW_AUTH_CONFIG_PATH=$AUTH_INI
  MLFLOW_FLASK_SERVER_SECRET_KEY=$(<"$SECRET_FILE")
  export MLFLOW_FLASK_SERVER_SECRET_KEY
  unset MLFLOW_AUTH_ADMIN_USERNAME MLFLOW_AUTH_ADMIN_PASSWORD
  args+=(--app-name basic-auth)
  echo "credentials: only user '$AUTH_USER' may use this server; its password is in $CREDS and $DIR_CREDS (both 0600); MLflow clients read ~/.mlflow/credentials, or MLFLOW_TRACKING_USERNAME/PASSWORD when set" >&2
  if [ -n "${MLFLOW_TRACKING_USERNAME:-}" ] && [ "$MLFLOW_TRACKING_USERNAME" != "$AUTH_USER" ]; then
    echo "mlflow-server.sh: note: MLFLOW_TRACKING_USERNAME=$MLFLOW_TRACKING_USERNAME is set here and wins over $CREDS in clients" >&2
  fi
fi

echo "MLFLOW_TRACKING_URI=$URI"
echo "backend store $BACKEND, artifacts $ARTIFACTS; dashboard at $URI (ssh -L $PORT:localhost:$PORT from your laptop)" >&2
if [ $DETACH = 0 ]; then
  echo $$ >"$PIDFILE"
  exec "$MLFLOW" "${args[@]}"
fi

# /health over bash's /dev/tcp, so that curl is not needed.
health_ok() {
  local reply
  local request='GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n'
  reply=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT && printf '$request' >&3 && head -n 1 <&3" 2>/dev/null) ||
    return 1
  [[ $reply == *" 200 "* ]]
}

setsid "$MLFLOW" "${args[@]}" </dev/null >>"$LOGFILE" 2>&1 &
echo $! >"$PIDFILE"
deadline=$((SECONDS + ${MLFLOW_SERVER_TIMEOUT:-120}))
while [ $SECONDS -lt $deadline ]; do
  if health_ok; then
    echo "MLflow server up (pid $(cat "$PIDFILE")); stop it with: $0 --dir $DIR --stop" >&2
    exit 0
  fi
  [ -d "/proc/$(cat "$PIDFILE")" ] || { tail -n 20 "$LOGFILE" >&2; die "the MLflow server exited (log: $LOGFILE)"; }
  sleep 0.1
done
tail -n 20 "$LOGFILE" >&2
die "the MLflow server did not answer /health within ${MLFLOW_SERVER_TIMEOUT:-120} s (log: $LOGFILE)"
