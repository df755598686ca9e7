#!/usr/bin/env bash
# Starts a real SLURM cluster with accounting on localhost: munged, MariaDB, slurmdbd, slurmctld and one slurmd
# per node (one node by default; several, each a slurmd of this host with its own name and port), every file
# (configs, keys, sockets, databases, spool, logs, pid files) under STATE_DIR, fake A100 GPUs (gpu:a100:2 backed
# by /dev/null and /dev/zero) and ports nobody else uses. Needs root. Safe to run again: it
# starts only what is not already running. Prints the line to paste into a shell, e.g.
#   export SLURM_CONF=/tmp/tc/etc/slurm.conf
#
# Usage: start.sh STATE_DIR
# Environment (all optional):
#   TESTCLUSTER_OWNER_PID  pid of the process that owns this cluster (the test session); once it has died, a later
#                          start.sh treats this cluster as stale and stops it
#   TESTCLUSTER_NAME       ClusterName (default testcluster)
#   TESTCLUSTER_ACCOUNT    the account created for root (default asr)
#   TESTCLUSTER_GPUS       number of fake a100 GPUs on each node, 1 or 2 (default 2)
#   TESTCLUSTER_TIMEOUT    seconds to wait for each daemon (default 60)
#   TESTCLUSTER_MAX_ARRAY_SIZE  MaxArraySize (default 10001; the largest array index is one less)
#   TESTCLUSTER_CPUS       CPUs each node offers (default: the host's, whatever OMP_NUM_THREADS says); more
#                          oversubscribes the host
#                          (SlurmdParameters=config_overrides), for tests that need more job slots than cores
#   TESTCLUSTER_NODES      number of nodes, 1 to 8 (default 1). One node is named after this host; with more, the
#                          nodes are HOST-1 ... HOST-N, each a slurmd of this host (slurmd -N NAME) with its own
#                          port, spool dir, log and pid file (SlurmdSpoolDir=.../slurmd-%n and so on), each with
#                          the CPUs and GPUs above and an equal share of the memory
# A running cluster started with other values of these is restarted with new configs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
tc_state_dir_arg "$0" "$@"
tc_paths

T0=$(date +%s%N)
CLUSTER=${TESTCLUSTER_NAME:-testcluster}
ACCOUNT=${TESTCLUSTER_ACCOUNT:-asr}
NGPUS=${TESTCLUSTER_GPUS:-2}
TIMEOUT=${TESTCLUSTER_TIMEOUT:-60}
MAX_ARRAY_SIZE=${TESTCLUSTER_MAX_ARRAY_SIZE:-10001}
# the host's CPUs: nproc answers OMP_NUM_THREADS and OMP_THREAD_LIMIT, which say nothing of the host
HOST_CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
NCPUS=${TESTCLUSTER_CPUS:-$HOST_CPUS}
NNODES=${TESTCLUSTER_NODES:-1}
NODE=$(hostname -s)
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
DB_SOCKET=$DB_DIR/mysqld.sock

[[ $CLUSTER =~ ^[a-z][a-z0-9_]{0,39}$ ]] || tc_die "TESTCLUSTER_NAME='$CLUSTER' is not valid (lower-case letters, digits, _)"
[[ $ACCOUNT =~ ^[a-z][a-z0-9_]{0,39}$ ]] || tc_die "TESTCLUSTER_ACCOUNT='$ACCOUNT' is not valid (lower-case letters, digits, _)"
[[ $NGPUS =~ ^[12]$ ]] || tc_die "TESTCLUSTER_GPUS='$NGPUS' is not valid (1 or 2: one fake device each for /dev/null, /dev/zero)"
[[ $MAX_ARRAY_SIZE =~ ^[1-9][0-9]{0,6}$ ]] && [ "$MAX_ARRAY_SIZE" -le 4000001 ] ||
  tc_die "TESTCLUSTER_MAX_ARRAY_SIZE='$MAX_ARRAY_SIZE' is not valid (1 to 4000001)"
[[ $NCPUS =~ ^[1-9][0-9]{0,3}$ ]] || tc_die "TESTCLUSTER_CPUS='$NCPUS' is not valid (a count of CPUs)"
[[ $NNODES =~ ^[1-8]$ ]] ||
  tc_die "TESTCLUSTER_NODES='$NNODES' is not valid (1 to 8: the number of nodes, each a slurmd of this host)"
# One node is named after this host; several are HOST-1 ... HOST-N (slurmd -N NAME), all at 127.0.0.1.
if [ "$NNODES" = 1 ]; then
  NODES=("$NODE")
else
  NODES=()
  for ((i = 1; i <= NNODES; i++)); do NODES+=("$NODE-$i"); done
fi
[ "$(id -u)" -eq 0 ] || tc_die "must run as root (the SLURM daemons, munged and MariaDB are started here); run: sudo $0 $STATE_DIR"
# Unix socket paths are limited to 107 bytes.
[ ${#DB_SOCKET} -lt 100 ] || tc_die "STATE_DIR '$STATE_DIR' is too long for unix socket paths (keep it under 80 characters)"

elapsed() { echo $((($(date +%s%N) - T0) / 1000000)) | awk '{printf "%.1f", $1 / 1000}'; }

# Polls COMMAND... (each try limited to 10 s) every 0.2 s until it succeeds; dies naming WHAT and the LOG to
# read after TIMEOUT seconds.
wait_for() {
  local what=$1 log=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  while [ $SECONDS -lt $deadline ]; do
    if declare -F "$1" >/dev/null; then
      "$@" >/dev/null 2>&1 && return 0
    elif timeout 10 "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  tc_log "last lines of $log:"
  tail -n 20 "$log" >&2 2>/dev/null || true
  tc_die "$what did not come up within ${TIMEOUT}s (see $log)"
}

ensure_packages() {
  local missing=() bin pkg
  for pair in munged:munge mariadbd:mariadb-server mariadb-install-db:mariadb-server slurmdbd:slurmdbd \
    slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client sacctmgr:slurm-client; do
    bin=${pair%%:*} pkg=${pair#*:}
    PATH=$PATH:/usr/sbin:/sbin command -v "$bin" >/dev/null || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  # slurm-wlm pulls in slurmctld, slurmd and the plugins (select/cons_tres, accounting_storage/slurmdbd).
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" slurm-wlm | sort -u)
  tc_log "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The packages start system-wide services on install where an init system runs; this cluster uses its own.
}
export PATH=$PATH:/usr/sbin:/sbin

# Stops clusters of earlier sessions that were never stopped: their state dir is gone or their owner has died.
clean_stale_clusters() {
  local dir owner pid start
  [ -f "$TC_REGISTRY_DIR/clusters" ] || return 0
  while read -r dir; do
    [ -n "$dir" ] && [ "$dir" != "$STATE_DIR" ] || continue
    if [ -d "$dir" ]; then
      [ -f "$dir/owner" ] || continue
      read -r pid start <"$dir/owner" || continue
      if [ -d "/proc/$pid" ] && [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ]; then continue; fi
      tc_log "stopping stale cluster $dir (its owner, pid $pid, has exited)"
    else
      tc_log "stopping stale cluster $dir (its state dir is gone)"
    fi
    tc_stop_dir "$dir"
    tc_registry_remove "$dir"
  done < <(cat "$TC_REGISTRY_DIR/clusters")
}

any_daemon_running() {
  local d n
  for d in "${TC_DAEMONS[@]}"; do tc_running_pid "$d" >/dev/null && return 0; done
  for n in "${NODES[@]}"; do slurmd_pid "$n" >/dev/null && return 0; done
  return 1
}

port_in_use() {
  if command -v ss >/dev/null; then
    ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q . && return 0
  fi
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Three plus one per node consecutive free ports at a random base: slurmctld, the first node's slurmd, slurmdbd,
# MariaDB, then the slurmd of every further node.
choose_ports() {
  local base i ok n=$((3 + NNODES))
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 20000))
    ok=1
    for ((i = 0; i < n; i++)); do port_in_use $((base + i)) && ok=0 && break; done
    if [ $ok = 1 ]; then
      CTLD_PORT=$base SLURMD_PORT=$((base + 1)) DBD_PORT=$((base + 2)) DB_PORT=$((base + 3))
      SLURMD_PORTS=$SLURMD_PORT
      for ((i = 2; i <= NNODES; i++)); do SLURMD_PORTS+=" $((base + 2 + i))"; done
      return 0
    fi
  done
  tc_die "no $n consecutive free TCP ports found between 20000 and 40000"
}

# Where each node's slurmd keeps its pid file, log and spool dir: the single-node paths for one node, paths with
# the node's name (SLURM's %n) for several.
slurmd_stem() { if [ "$NNODES" = 1 ]; then echo slurmd; else echo "slurmd-$1"; fi; }
slurmd_pid() { tc_running_pid slurmd "$(slurmd_stem "$1")"; }
slurmd_log() { echo "$LOG/$(slurmd_stem "$1").log"; }

write_configs() {
  local mem_mb db_pass overrides="" stem=slurmd node_lines="" ports i
  # More CPUs than the host has: slurmd would drain the node for "Low socket*core*thread count" without this.
  if [ "$NCPUS" -gt "$HOST_CPUS" ]; then overrides="SlurmdParameters=config_overrides"; fi
  # Leave 10% of the memory to the system so slurmd never finds less than configured (that drains the node).
  # Several nodes share it equally (each slurmd sees the whole host, so it never finds less than configured).
  mem_mb=$(awk -v n="$NNODES" '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9 / n}' /proc/meminfo)
  choose_ports
  if [ "$NNODES" = 1 ]; then
    node_lines="NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NCPUS RealMemory=$mem_mb Gres=gpu:a100:$NGPUS State=UNKNOWN"
  else
    stem=slurmd-%n
    read -r -a ports <<<"$SLURMD_PORTS"
    for ((i = 0; i < NNODES; i++)); do
      node_lines+="NodeName=${NODES[i]} NodeHostname=$NODE NodeAddr=127.0.0.1 Port=${ports[i]} CPUs=$NCPUS"
      node_lines+=" RealMemory=$mem_mb Gres=gpu:a100:$NGPUS State=UNKNOWN"$'\n'
    done
    node_lines=${node_lines%$'\n'}
  fi
  if [ ! -s "$ETC/db.password" ]; then
    (umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$ETC/db.password")
  fi
  db_pass=$(cat "$ETC/db.password")
  cat >"$ETC/ports.env" <<EOF
CTLD_PORT=$CTLD_PORT
SLURMD_PORT=$SLURMD_PORT
DBD_PORT=$DBD_PORT
DB_PORT=$DB_PORT
SLURMD_PORTS="$SLURMD_PORTS"
EOF
  : >"$ETC/plugstack.conf" # keeps /etc/slurm/plugstack.conf (and whatever it includes) out of this cluster

  cat >"$ETC/slurm.conf" <<EOF
# Generated by slurm/testcluster/start.sh for the state dir $STATE_DIR.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
CredType=cred/munge
# The connection to slurmdbd authenticates with the "global" MUNGE socket named here, not AuthInfo's.
AccountingStoragePass=$MUNGE_SOCKET
StateSaveLocation=$SPOOL/slurmctld
SlurmdSpoolDir=$SPOOL/$stem
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/$stem.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/$stem.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$ETC/plugstack.conf
# No cgroups here (containers rarely delegate them): track processes by parent pid, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
GresTypes=gpu
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
# Short timers so that cancelling, requeueing and node failures play out in seconds in the tests.
KillWait=5
MinJobAge=300
MessageTimeout=10
SlurmdTimeout=60
SlurmctldTimeout=60
InactiveLimit=0
ReturnToService=1
JobRequeue=1
MaxArraySize=$MAX_ARRAY_SIZE
MaxJobCount=50000
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
$overrides
$node_lines
PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP
EOF

  {
    echo "# Fake A100s: SLURM schedules them and sets CUDA_VISIBLE_DEVICES; the files only need to exist."
    echo "AutoDetect=off"
    for n in "${NODES[@]}"; do
      echo "NodeName=$n Name=gpu Type=a100 File=/dev/null"
      [ "$NGPUS" = 2 ] && echo "NodeName=$n Name=gpu Type=a100 File=/dev/zero"
    done
  } >"$ETC/gres.conf"

  # slurmdbd refuses a slurmdbd.conf that others can read (it holds the database password).
  (
    umask 077
    cat >"$ETC/slurmdbd.conf" <<EOF
# Generated by slurm/testcluster/start.sh for the state dir $STATE_DIR.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf"
}

start_munge() {
  tc_running_pid munged >/dev/null && return 0
  if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 400 "$MUNGE_DIR/munge.key"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  # --force: the state dir may sit under a world-writable /tmp, which munged otherwise refuses.
  munged --force --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" --pid-file="$RUN/munged.pid" \
    --log-file="$LOG/munged.log" --seed-file="$MUNGE_DIR/munged.seed" </dev/null >>"$LOG/munged.out" 2>&1 ||
    { tail -n 5 "$LOG/munged.out" "$LOG/munged.log" >&2 2>/dev/null; tc_die "munged failed to start (see $LOG/munged.log)"; }
  wait_for munged "$LOG/munged.log" bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'"
  tc_log "munged up ($(elapsed) s)"
}

db_opts=()
set_db_opts() {
  # Durability traded for speed: a test database that loses its last second on a crash is fine.
  # its own temporary folder: two clusters initialising at once in the shared /tmp lost each other's temporary
  # tables ("Could not remove temporary table", then mariadb-install-db aborted)
  mkdir -p "$DB_DIR/tmp"
  db_opts=(--no-defaults --datadir="$DB_DIR/data" --tmpdir="$DB_DIR/tmp" --socket="$DB_SOCKET" --port="$DB_PORT"
    --bind-address=127.0.0.1 --skip-name-resolve --user=root --innodb-buffer-pool-size=64M --innodb-log-file-size=16M
    --innodb-flush-log-at-trx-commit=2 --innodb-doublewrite=0 --skip-log-bin)
}

db_sql() { mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "$1"; }

start_mariadb() {
  local db_pass
  tc_running_pid mariadbd >/dev/null && return 0
  set_db_opts
  if [ ! -d "$DB_DIR/data/mysql" ]; then
    rm -rf "$DB_DIR/data"
    mariadb-install-db "${db_opts[@]}" --auth-root-authentication-method=socket --skip-test-db \
      >"$LOG/mariadb-install-db.log" 2>&1 ||
      { tail -n 20 "$LOG/mariadb-install-db.log" >&2; tc_die "mariadb-install-db failed (see $LOG/mariadb-install-db.log)"; }
    tc_log "MariaDB data dir initialised ($(elapsed) s)"
  fi
  rm -f "$DB_SOCKET"
  setsid mariadbd "${db_opts[@]}" --pid-file="$RUN/mariadbd.pid" --log-error="$LOG/mariadbd.log" \
    </dev/null >>"$LOG/mariadbd.out" 2>&1 &
  wait_for MariaDB "$LOG/mariadbd.log" mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root ping
  db_pass=$(cat "$ETC/db.password")
  db_sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
          ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
    tc_die "could not create the MariaDB user for slurmdbd (see $LOG/mariadbd.log)"
  tc_log "MariaDB up on 127.0.0.1:$DB_PORT ($(elapsed) s)"
}

start_slurmdbd() {
  tc_running_pid slurmdbd >/dev/null && return 0
  slurmdbd </dev/null >>"$LOG/slurmdbd.out" 2>&1 || tc_die "slurmdbd failed to start (see $LOG/slurmdbd.log)"
  wait_for slurmdbd "$LOG/slurmdbd.log" sacctmgr -n list cluster
  tc_log "slurmdbd up on 127.0.0.1:$DBD_PORT ($(elapsed) s)"
}

# The cluster, an account and root's association; -i answers sacctmgr's questions, and adding what exists is
# a no-op that exits non-zero, so existence is checked first.
ensure_associations() {
  local users=(root) u
  [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && users+=("$SUDO_USER")
  if [ -z "$(sacctmgr -n -P list cluster "$CLUSTER" format=cluster)" ]; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
  if [ -z "$(sacctmgr -n -P list account "$ACCOUNT" format=account)" ]; then
    sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description="test account" organization=test >/dev/null
  fi
  for u in "${users[@]}"; do
    if [ -z "$(sacctmgr -n -P list assoc cluster="$CLUSTER" account="$ACCOUNT" user="$u" format=user)" ]; then
      sacctmgr -i add user "$u" account="$ACCOUNT" defaultaccount="$ACCOUNT" cluster="$CLUSTER" >/dev/null
    fi
  done
}

start_slurmctld() {
  tc_running_pid slurmctld >/dev/null && return 0
  slurmctld -f "$SLURM_CONF_PATH" </dev/null >>"$LOG/slurmctld.out" 2>&1 ||
    tc_die "slurmctld failed to start (see $LOG/slurmctld.log)"
  wait_for slurmctld "$LOG/slurmctld.log" bash -c "scontrol ping | grep -q 'is UP'"
  tc_log "slurmctld up on 127.0.0.1:$CTLD_PORT ($(elapsed) s)"
}

declare -A SLURMD_STARTED=()
start_slurmd() {
  local n=$1 out
  slurmd_pid "$n" >/dev/null && return 0
  out=$LOG/$(slurmd_stem "$n").out
  SLURMD_STARTED[$n]=$(date +%s)
  slurmd -f "$SLURM_CONF_PATH" -N "$n" </dev/null >>"$out" 2>&1 ||
    { tail -n 5 "$out" >&2 2>/dev/null; tc_die "slurmd of node $n failed to start (see $(slurmd_log "$n"))"; }
  if [ "$NNODES" = 1 ]; then
    tc_log "slurmd started ($(elapsed) s)"
  else
    tc_log "slurmd of node $n started ($(elapsed) s)"
  fi
}

node_state() { timeout 10 sinfo -h -N -n "$1" -o %T 2>/dev/null | head -n 1; }

# After a restart slurmctld shows the node's saved state before slurmd has registered; the node counts as up
# only once slurmctld has heard from the slurmd started here.
slurmd_registered() {
  local n=$1 t
  [ -z "${SLURMD_STARTED[$n]:-}" ] && return 0
  t=$(timeout 10 scontrol -o show node "$n" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
  [ -n "$t" ] && [ "$t" != None ] && [ "$(date -d "$t" +%s)" -ge $((SLURMD_STARTED[$n] - 1)) ]
}

wait_node_idle() {
  local n=$1 i state resumed=0 deadline=$((SECONDS + TIMEOUT))
  for ((i = 0; SECONDS < deadline; i++)); do
    state=$(node_state "$n")
    case $state in
      idle | mixed | allocated) slurmd_registered "$n" && return 0 ;;
      # Left drained or down by a test of an earlier session that reused this state dir.
      drain* | drained | down*)
        if [ $resumed = 0 ] && slurmd_pid "$n" >/dev/null && [ $i -gt 5 ]; then
          scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
          resumed=1
        fi
        ;;
    esac
    sleep 0.2
  done
  tail -n 20 "$(slurmd_log "$n")" >&2 || true
  tc_die "node $n is '$state', not idle, after ${TIMEOUT}s (see $(slurmd_log "$n") and $LOG/slurmctld.log)"
}

cluster_registered() {
  [ -n "$(timeout 10 sacctmgr -n -P list cluster "$CLUSTER" format=controlhost 2>/dev/null | tr -d '[:space:]')" ]
}

# --- main ----------------------------------------------------------------------------------------------------
ensure_packages
clean_stale_clusters
mkdir -p "$STATE_DIR" "$ETC" "$RUN" "$LOG" "$SPOOL/slurmctld" "$MUNGE_DIR" "$DB_DIR"
for n in "${NODES[@]}"; do mkdir -p "$SPOOL/$(slurmd_stem "$n")"; done
chmod 755 "$MUNGE_DIR" # users other than root reach the socket through it; the key itself is 0400
if [ -n "${TESTCLUSTER_OWNER_PID:-}" ]; then
  [ -d "/proc/$TESTCLUSTER_OWNER_PID" ] || tc_die "TESTCLUSTER_OWNER_PID=$TESTCLUSTER_OWNER_PID is not a running process"
  echo "$TESTCLUSTER_OWNER_PID $(awk '{print $22}' "/proc/$TESTCLUSTER_OWNER_PID/stat")" >"$STATE_DIR/owner"
fi
tc_registry_add "$STATE_DIR"

# Configs written by another version of these scripts are replaced (with a restart) rather than reused.
GENERATOR=$( (cat "$HERE/start.sh" "$HERE/lib.sh"; echo "MaxArraySize=$MAX_ARRAY_SIZE CPUs=$NCPUS Nodes=$NNODES") | sha256sum | cut -c1-16)
RESTORED_JOBS_ARE_ORPHANS=0
if any_daemon_running && [ "$(cat "$ETC/generator" 2>/dev/null)" != "$GENERATOR" ]; then
  tc_log "the running cluster was configured by another version of start.sh (or other TESTCLUSTER_* values); restarting it"
  tc_stop_dir "$STATE_DIR"
fi
if any_daemon_running && [ -f "$ETC/ports.env" ]; then
  # shellcheck disable=SC1091
  source "$ETC/ports.env"
else
  # Nothing of ours runs: clear what a killed session left (orphaned job steps, pid files) and use fresh ports.
  tc_stop_dir "$STATE_DIR"
  write_configs
  echo "$GENERATOR" >"$ETC/generator"
  RESTORED_JOBS_ARE_ORPHANS=1
fi
export SLURM_CONF=$SLURM_CONF_PATH

start_munge
start_mariadb
start_slurmdbd
ensure_associations
start_slurmctld
for n in "${NODES[@]}"; do start_slurmd "$n"; done
if [ $RESTORED_JOBS_ARE_ORPHANS = 1 ]; then
  # slurmctld restores the jobs of its last run from the state dir, but nothing of that run survived (the
  # daemons were down and their job steps have been stopped above): without this they would hold the node's
  # CPUs and GPUs as "RUNNING" until slurmctld gives up on them.
  mapfile -t orphans < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
  if [ ${#orphans[@]} -gt 0 ]; then
    tc_log "cancelling ${#orphans[@]} job(s) restored from the previous run of this cluster: ${orphans[*]}"
    timeout 20 scancel "${orphans[@]}" >/dev/null 2>&1 || true
  fi
fi
for n in "${NODES[@]}"; do wait_node_idle "$n"; done
wait_for "registration of cluster $CLUSTER in slurmdbd" "$LOG/slurmctld.log" cluster_registered
if [ "$NNODES" = 1 ]; then
  tc_log "cluster $CLUSTER ready: node $NODE idle with gpu:a100:$NGPUS, $NCPUS CPUs, MaxArraySize=$MAX_ARRAY_SIZE ($(elapsed) s)"
else
  tc_log "cluster $CLUSTER ready: nodes ${NODES[*]} idle, each with gpu:a100:$NGPUS and $NCPUS CPUs," \
    "MaxArraySize=$MAX_ARRAY_SIZE ($(elapsed) s)"
fi
echo "export SLURM_CONF=$SLURM_CONF_PATH"
