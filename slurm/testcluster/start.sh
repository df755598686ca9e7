#!/usr/bin/env bash
# Starts a real single-node SLURM cluster with accounting on localhost: munged, MariaDB, slurmdbd, slurmctld and
# slurmd, every file (configs, keys, sockets, databases, spool, logs, pid files) under STATE_DIR, fake A100 GPUs
# (gpu:a100:2 backed by /dev/null and /dev/zero) and ports nobody else uses. Needs root. Safe to run again: it
# starts only what is not already running. Prints the line to paste into a shell, e.g.
#   export SLURM_CONF=/tmp/tc/etc/slurm.conf
#
# Usage: start.sh STATE_DIR
# Environment (all optional):
#   TESTCLUSTER_OWNER_PID  pid of the process that owns this cluster (the test session); once it has died, a later
#                          start.sh treats this cluster as stale and stops it
#   TESTCLUSTER_NAME       ClusterName (default testcluster)
#   TESTCLUSTER_ACCOUNT    the account created for root (default asr)
#   TESTCLUSTER_GPUS       number of fake a100 GPUs on the node, 1 or 2 (default 2)
#   TESTCLUSTER_TIMEOUT    seconds to wait for each daemon (default 60)
#   TESTCLUSTER_MAX_ARRAY_SIZE  MaxArraySize (default 10001; the largest array index is one less)
#   TESTCLUSTER_CPUS       CPUs the node offers (default: nproc); more than nproc oversubscribes the host
#                          (SlurmdParameters=config_overrides), for tests that need more job slots than cores
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
NCPUS=${TESTCLUSTER_CPUS:-$(nproc)}
NODE=$(hostname -s)
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
DB_SOCKET=$DB_DIR/mysqld.sock

[[ $CLUSTER =~ ^[a-z][a-z0-9_]{0,39}$ ]] || tc_die "TESTCLUSTER_NAME='$CLUSTER' is not valid (lower-case letters, digits, _)"
[[ $ACCOUNT =~ ^[a-z][a-z0-9_]{0,39}$ ]] || tc_die "TESTCLUSTER_ACCOUNT='$ACCOUNT' is not valid (lower-case letters, digits, _)"
[[ $NGPUS =~ ^[12]$ ]] || tc_die "TESTCLUSTER_GPUS='$NGPUS' is not valid (1 or 2: one fake device each for /dev/null, /dev/zero)"
[[ $MAX_ARRAY_SIZE =~ ^[1-9][0-9]{0,6}$ ]] && [ "$MAX_ARRAY_SIZE" -le 4000001 ] ||
  tc_die "TESTCLUSTER_MAX_ARRAY_SIZE='$MAX_ARRAY_SIZE' is not valid (1 to 4000001)"
[[ $NCPUS =~ ^[1-9][0-9]{0,3}$ ]] || tc_die "TESTCLUSTER_CPUS='$NCPUS' is not valid (a count of CPUs)"
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
  local d
  for d in "${TC_DAEMONS[@]}"; do tc_running_pid "$d" >/dev/null && return 0; done
  return 1
}

port_in_use() {
  if command -v ss >/dev/null; then
    ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q . && return 0
  fi
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Four consecutive free ports at a random base: slurmctld, slurmd, slurmdbd, MariaDB.
choose_ports() {
  local base i ok
  for _ in $(seq 50); do
    base=$((20000 + RANDOM % 20000))
    ok=1
    for i in 0 1 2 3; do port_in_use $((base + i)) && ok=0 && break; done
    if [ $ok = 1 ]; then
      CTLD_PORT=$base SLURMD_PORT=$((base + 1)) DBD_PORT=$((base + 2)) DB_PORT=$((base + 3))
      return 0
    fi
  done
  tc_die "no four consecutive free TCP ports found between 20000 and 40000"
}

write_configs() {
  local mem_mb db_pass overrides=""
  # More CPUs than the host has: slurmd would drain the node for "Low socket*core*thread count" without this.
  if [ "$NCPUS" -gt "$(nproc)" ]; then overrides="SlurmdParameters=config_overrides"; fi
  # Leave 10% of the memory to the system so slurmd never finds less than configured (that drains the node).
  mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
  choose_ports
  if [ ! -s "$ETC/db.password" ]; then
    (umask 077 && od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$ETC/db.password")
  fi
  db_pass=$(cat "$ETC/db.password")
  cat >"$ETC/ports.env" <<EOF
CTLD_PORT=$CTLD_PORT
SLURMD_PORT=$SLURMD_PORT
DBD_PORT=$DBD_PORT
DB_PORT=$DB_PORT
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
SlurmdSpoolDir=$SPOOL/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
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
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NCPUS RealMemory=$mem_mb Gres=gpu:a100:$NGPUS State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=$NODE MaxTime=INFINITE State=UP
EOF

  {
    echo "# Fake A100s: SLURM schedules them and sets CUDA_VISIBLE_DEVICES; the files only need to exist."
    echo "AutoDetect=off"
    echo "NodeName=$NODE Name=gpu Type=a100 File=/dev/null"
    [ "$NGPUS" = 2 ] && echo "NodeName=$NODE Name=gpu Type=a100 File=/dev/zero"
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
  db_opts=(--no-defaults --datadir="$DB_DIR/data" --socket="$DB_SOCKET" --port="$DB_PORT" --bind-address=127.0.0.1
    --skip-name-resolve --user=root --innodb-buffer-pool-size=64M --innodb-log-file-size=16M
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

SLURMD_STARTED=0
start_slurmd() {
  tc_running_pid slurmd >/dev/null && return 0
  SLURMD_STARTED=$(date +%s)
  slurmd -f "$SLURM_CONF_PATH" -N "$NODE" </dev/null >>"$LOG/slurmd.out" 2>&1 ||
    tc_die "slurmd failed to start (see $LOG/slurmd.log)"
  tc_log "slurmd started ($(elapsed) s)"
}

node_state() { timeout 10 sinfo -h -N -n "$NODE" -o %T 2>/dev/null | head -n 1; }

# After a restart slurmctld shows the node's saved state before slurmd has registered; the node counts as up
# only once slurmctld has heard from the slurmd started here.
slurmd_registered() {
  local t
  [ "$SLURMD_STARTED" = 0 ] && return 0
  t=$(timeout 10 scontrol -o show node "$NODE" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2)
  [ -n "$t" ] && [ "$t" != None ] && [ "$(date -d "$t" +%s)" -ge $((SLURMD_STARTED - 1)) ]
}

wait_node_idle() {
  local i state resumed=0 deadline=$((SECONDS + TIMEOUT))
  for ((i = 0; SECONDS < deadline; i++)); do
    state=$(node_state)
    case $state in
      idle | mixed | allocated) slurmd_registered && return 0 ;;
      # Left drained or down by a test of an earlier session that reused this state dir.
      drain* | drained | down*)
        if [ $resumed = 0 ] && tc_running_pid slurmd >/dev/null && [ $i -gt 5 ]; then
          scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
          resumed=1
        fi
        ;;
    esac
    sleep 0.2
  done
  tail -n 20 "$LOG/slurmd.log" >&2 || true
  tc_die "node $NODE is '$state', not idle, after ${TIMEOUT}s (see $LOG/slurmd.log and $LOG/slurmctld.log)"
}

cluster_registered() {
  [ -n "$(timeout 10 sacctmgr -n -P list cluster "$CLUSTER" format=controlhost 2>/dev/null | tr -d '[:space:]')" ]
}

# --- main ----------------------------------------------------------------------------------------------------
ensure_packages
clean_stale_clusters
mkdir -p "$STATE_DIR" "$ETC" "$RUN" "$LOG" "$SPOOL/slurmctld" "$SPOOL/slurmd" "$MUNGE_DIR" "$DB_DIR"
chmod 755 "$MUNGE_DIR" # users other than root reach the socket through it; the key itself is 0400
if [ -n "${TESTCLUSTER_OWNER_PID:-}" ]; then
  [ -d "/proc/$TESTCLUSTER_OWNER_PID" ] || tc_die "TESTCLUSTER_OWNER_PID=$TESTCLUSTER_OWNER_PID is not a running process"
  echo "$TESTCLUSTER_OWNER_PID $(awk '{print $22}' "/proc/$TESTCLUSTER_OWNER_PID/stat")" >"$STATE_DIR/owner"
fi
tc_registry_add "$STATE_DIR"

# Configs written by another version of these scripts are replaced (with a restart) rather than reused.
GENERATOR=$( (cat "$HERE/start.sh" "$HERE/lib.sh"; echo "MaxArraySize=$MAX_ARRAY_SIZE CPUs=$NCPUS") | sha256sum | cut -c1-16)
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
start_slurmd
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
wait_node_idle
wait_for "registration of cluster $CLUSTER in slurmdbd" "$LOG/slurmctld.log" cluster_registered
tc_log "cluster $CLUSTER ready: node $NODE idle with gpu:a100:$NGPUS, $NCPUS CPUs, MaxArraySize=$MAX_ARRAY_SIZE ($(elapsed) s)"
echo "export SLURM_CONF=$SLURM_CONF_PATH"
