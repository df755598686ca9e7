# Shared by start.sh and stop.sh: where things live under STATE_DIR and how a daemon we started is recognised.
# Sourced, not run. tc_state_dir_arg sets STATE_DIR (an absolute path) from the command line.

TC_DAEMONS=(slurmd slurmctld slurmdbd mariadbd munged)   # stop order; start order is the reverse
TC_REGISTRY_DIR=${TESTCLUSTER_REGISTRY_DIR:-/var/tmp/slurm-testcluster}

tc_log() { printf '[testcluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
tc_die() { printf '[testcluster] error: %s\n' "$*" >&2; exit 1; }

# tc_state_dir_arg "$0" "$@": the scripts' one argument, STATE_DIR (absolute); usage and exit 2 otherwise
tc_state_dir_arg() {
  local script=$1; shift
  if [ $# -ne 1 ] || [ "${1:0:1}" = - ]; then
    echo "usage: $script STATE_DIR" >&2
    exit 2
  fi
  STATE_DIR=$(realpath -m -- "$1")
}

tc_paths() {
  ETC=$STATE_DIR/etc
  RUN=$STATE_DIR/run
  LOG=$STATE_DIR/log
  SPOOL=$STATE_DIR/spool
  MUNGE_DIR=$STATE_DIR/munge
  DB_DIR=$STATE_DIR/mysql
  SLURM_CONF_PATH=$ETC/slurm.conf
}

# The pid file of each daemon (each daemon is told to write exactly this file).
tc_pidfile() { printf '%s/%s.pid' "$RUN" "$1"; }

# True when PID is alive and belongs to this state dir: its command line or its environment names STATE_DIR.
# Every daemon is started with a path under STATE_DIR on its command line or SLURM_CONF under it in its
# environment, so a recycled pid of an unrelated process never matches.
tc_pid_is_ours() {
  local pid=$1 dir=${2:-$STATE_DIR}
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -d "/proc/$pid" ] || return 1
  if tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$dir/"; then return 0; fi
  tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF -- "SLURM_CONF=$dir/etc/slurm.conf"
}

# Prints the pid of DAEMON when its pid file (RUN/STEM.pid, STEM defaulting to DAEMON; the slurmd of each node of
# a cluster of several has its own) names a live process of ours; fails otherwise.
tc_running_pid() {
  local f pid
  f=$(tc_pidfile "${2:-$1}")
  [ -f "$f" ] || return 1
  pid=$(tr -dc '0-9' <"$f")
  tc_pid_is_ours "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
  printf '%s' "$pid"
}

# Sends TERM, waits up to TIMEOUT seconds, then KILL. Only ever called with pids that passed tc_pid_is_ours.
tc_kill_wait() {
  local pid=$1 timeout=${2:-10} i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < timeout * 10; i++)); do
    [ -d "/proc/$pid" ] || return 0
    # A zombie whose parent has not reaped it yet is as good as gone.
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# Pids of the processes of the cluster under DIR that no pid file names: slurmstepd and the jobs it runs, or a
# daemon whose pid file was lost. A process counts only when it is one of our daemons (by name) naming DIR, or
# a job process (SLURM_JOB_ID set) whose SLURM_CONF is DIR's; the calling shell and its ancestors never count,
# so a shell or test runner that merely exported SLURM_CONF is left alone.
tc_pids_under() {
  local dir=$1 pid comm ancestors=" " a=$BASHPID
  while [ -n "$a" ] && [ "$a" != 0 ]; do
    ancestors+="$a "
    a=$(awk '{print $4}' "/proc/$a/stat" 2>/dev/null || true)
  done
  # One grep over all of /proc finds the candidates (a shell loop per process takes seconds on a busy host).
  {
    grep -lsF -- "$dir/" /proc/[0-9]*/cmdline
    grep -lszxF -- "SLURM_CONF=$dir/etc/slurm.conf" /proc/[0-9]*/environ
  } 2>/dev/null | cut -d/ -f3 | sort -un | while read -r pid; do
    [[ $ancestors == *" $pid "* ]] && continue
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    case $comm in
      slurmd | slurmctld | slurmdbd | mariadbd | munged | slurmstepd) printf '%s\n' "$pid" ;;
      *)
        grep -qszxF -- "SLURM_CONF=$dir/etc/slurm.conf" "/proc/$pid/environ" &&
          grep -qsz '^SLURM_JOB_ID=' "/proc/$pid/environ" && printf '%s\n' "$pid"
        ;;
    esac
  done
  return 0
}

# Stops everything of the cluster under DIR: the daemons from their pid files, then any process left that
# names DIR (slurmstepd and job processes carry SLURM_CONF in their environment).
tc_stop_dir() {
  local dir=$1 d f pid
  for d in "${TC_DAEMONS[@]}"; do
    # DAEMON.pid, and DAEMON-NODE.pid of each node's slurmd in a cluster of several nodes
    for f in "$dir/run/$d.pid" "$dir/run/$d"-*.pid; do
      [ -f "$f" ] || continue
      pid=$(tr -dc '0-9' <"$f")
      if tc_pid_is_ours "$pid" "$dir"; then
        tc_log "stopping $(basename "$f" .pid) (pid $pid)"
        tc_kill_wait "$pid" 15
      fi
      rm -f "$f"
    done
  done
  # Leftovers (job steps of a killed slurmd) all at once: TERM, up to 3 s for them to go, then KILL.
  local left=() i
  mapfile -t left < <(tc_pids_under "$dir")
  [ ${#left[@]} -eq 0 ] && return 0
  for pid in "${left[@]}"; do
    tc_log "stopping leftover process $pid ($(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | cut -c1-60))"
    kill -TERM "$pid" 2>/dev/null || true
  done
  for ((i = 0; i < 30; i++)); do
    local alive=0
    for pid in "${left[@]}"; do
      [ -d "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && alive=1
    done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

tc_registry_add() {
  mkdir -p "$TC_REGISTRY_DIR"
  (
    flock 9
    grep -qxF -- "$1" "$TC_REGISTRY_DIR/clusters" 2>/dev/null || printf '%s\n' "$1" >>"$TC_REGISTRY_DIR/clusters"
  ) 9>"$TC_REGISTRY_DIR/lock"
}

tc_registry_remove() {
  [ -f "$TC_REGISTRY_DIR/clusters" ] || return 0
  (
    flock 9
    grep -vxF -- "$1" "$TC_REGISTRY_DIR/clusters" >"$TC_REGISTRY_DIR/clusters.new" || true
    mv "$TC_REGISTRY_DIR/clusters.new" "$TC_REGISTRY_DIR/clusters"
  ) 9>"$TC_REGISTRY_DIR/lock"
}
