#!/usr/bin/env bash
# Stops the test cluster that start.sh started under STATE_DIR: slurmd, slurmctld, slurmdbd, MariaDB and munged
# from their pid files, then any job step of that cluster still running. Touches no other process. The state
# dir is kept (start.sh on it again brings the same cluster back); remove it yourself when done.
#
# Usage: stop.sh STATE_DIR
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
tc_state_dir_arg "$0" "$@"
tc_paths

if [ ! -d "$STATE_DIR" ]; then
  tc_log "no state dir $STATE_DIR; looking for processes that still name it"
fi
# Cancel the jobs first so their steps end through SLURM rather than being killed under it.
if [ -f "$SLURM_CONF_PATH" ] && tc_running_pid slurmctld >/dev/null; then
  export SLURM_CONF=$SLURM_CONF_PATH
  mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
  [ ${#jobs[@]} -gt 0 ] && { timeout 10 scancel --quiet "${jobs[@]}" >/dev/null 2>&1 || true; }
fi
tc_stop_dir "$STATE_DIR"
tc_registry_remove "$STATE_DIR"
tc_log "stopped the cluster under $STATE_DIR"
