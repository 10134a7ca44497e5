#!/bin/bash
# Usage: with_info.sh UNIRANK COMMAND [ARGS...]
#
# Prints one line describing this task, then replaces itself with COMMAND:
#   UNIRANK_INFO {"slurm_job_id": "<SLURM_JOB_ID>", "slurm_step_id": "<SLURM_STEP_ID>",
#                 "info": <`UNIRANK info --json` without its "sources" and "candidates">}
# on one short line: srun relays a line of more than 1 KiB in pieces that other tasks' lines
# can split, so the explanations are left out.
# Reads: SLURM_JOB_ID, SLURM_STEP_ID (raw, to check unirank's reading of them).
set -euo pipefail
unirank=$1
shift
info=$("$unirank" info --json | python3 -c '
import json, sys
data = json.load(sys.stdin)
print(json.dumps({k: v for k, v in data.items() if k not in ("sources", "candidates")}))')
printf 'UNIRANK_INFO {"slurm_job_id": "%s", "slurm_step_id": "%s", "info": %s}\n' \
    "${SLURM_JOB_ID:-}" "${SLURM_STEP_ID:-}" "$info"
exec "$@"
