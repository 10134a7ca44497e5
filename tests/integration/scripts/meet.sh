#!/bin/bash
# Usage: meet.sh FIFO write|read COMMAND [ARGS...]
#
# Proves that two Slurm steps (or jobs) run at the same time, without sleeping: task 0 of the
# step opens the named pipe FIFO for writing (or reading); opening a pipe blocks until the other
# end is opened too, so both return only when both steps are alive at once. After 30 s without
# a partner it prints "MEET_TIMEOUT <role>" and exits 3. Then it replaces itself with COMMAND.
# Reads: SLURM_PROCID (only task 0 meets).
set -euo pipefail
fifo=$1
role=$2
shift 2
if [[ ${SLURM_PROCID:-0} == 0 ]]; then
    case $role in
        write) timeout 30 sh -c 'echo met >"$1"' sh "$fifo" || { echo "MEET_TIMEOUT write"; exit 3; } ;;
        read) timeout 30 sh -c 'cat "$1" >/dev/null' sh "$fifo" || { echo "MEET_TIMEOUT read"; exit 3; } ;;
        *) echo "meet.sh: role must be write or read, not $role" >&2; exit 2 ;;
    esac
    echo "MET $role job=${SLURM_JOB_ID:-} step=${SLURM_STEP_ID:-}"
fi
exec "$@"
