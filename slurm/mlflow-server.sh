#!/usr/bin/env bash
# Starts an MLflow tracking server for a sweep: the place every SLURM job of the sweep logs to, and the dashboard.
# Runs on the login node (or any machine the compute nodes can reach). Bound to 127.0.0.1 unless --host names
# another address; jobs on other nodes need --host 0.0.0.0 (or the node's cluster address).
#
# Usage: slurm/mlflow-server.sh [options]
#   --dir DIR                 where the database, artifacts, log and pid file live (default: ./mlflow-server)
#   --backend-store-uri URI   tracking store (default: sqlite:///DIR/mlflow.db); e.g. postgresql://user@host/db
#   --artifacts-destination P where the server stores artifacts (default: DIR/artifacts)
#   --host HOST               address to bind (default: 127.0.0.1)
#   --port PORT               port (default: 5000)
#   --workers N               server worker processes (default: 4)
#   --allowed-hosts LIST      Host headers the server accepts; default when --host is not local: this machine's
#                             names and addresses, localhost and private networks
#   --detach                  run in the background, wait until /health answers, print the URI and return
#   --stop                    stop the server started with --detach under DIR
#   -h, --help                this text
# Environment: MLFLOW (the mlflow executable; default: the repository's .venv, then PATH),
#   MLFLOW_SERVER_DIR (default for --dir), MLFLOW_SERVER_TIMEOUT (seconds --detach waits for /health; 120),
#   MLFLOW_SERVER_ENABLE_JOB_EXECUTION (MLflow's GenAI job runner; default false here)
# The first line on stdout is the URI to give to jobs and to `orchestrate submit --tracking-uri`:
#   MLFLOW_TRACKING_URI=http://HOST:PORT
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { printf 'mlflow-server.sh: error: %s\n' "$*" >&2; exit 2; }

DIR=${MLFLOW_SERVER_DIR:-./mlflow-server}
BACKEND= ARTIFACTS= HOST=127.0.0.1 PORT=5000 WORKERS=4 ALLOWED= DETACH=0 STOP=0
while [ $# -gt 0 ]; do
  case $1 in
    --dir) DIR=${2:?--dir needs a value}; shift 2 ;;
    --backend-store-uri) BACKEND=${2:?--backend-store-uri needs a value}; shift 2 ;;
    --artifacts-destination) ARTIFACTS=${2:?--artifacts-destination needs a value}; shift 2 ;;
    --host) HOST=${2:?--host needs a value}; shift 2 ;;
    --port) PORT=${2:?--port needs a value}; shift 2 ;;
    --workers) WORKERS=${2:?--workers needs a value}; shift 2 ;;
    --allowed-hosts) ALLOWED=${2:?--allowed-hosts needs a value}; shift 2 ;;
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
  repo_venv=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/mlflow
  if [ -x "$repo_venv" ]; then MLFLOW=$repo_venv; else MLFLOW=$(command -v mlflow || true); fi
fi
[ -n "$MLFLOW" ] && [ -x "$MLFLOW" ] || die "no mlflow executable found (set MLFLOW=/path/to/mlflow or run scripts/setup.sh)"

BACKEND=${BACKEND:-sqlite:///$DIR/mlflow.db}
ARTIFACTS=${ARTIFACTS:-$DIR/artifacts}
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

if pid=$(server_pid); then
  echo "MLFLOW_TRACKING_URI=$URI"
  echo "an MLflow server of $DIR is already running (pid $pid); log: $LOGFILE" >&2
  exit 0
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
