#!/bin/bash
# Usage: torchrun_node.sh static|c10d UNIRANK TORCHRUN NPROC SCRIPT [ARGS...]
#
# One srun task per node starts torchrun for its node, with the master address and port that
# unirank detects for the srun step (`UNIRANK info --json`: the step's first node, the port from
# README's formula), so that nothing has to be agreed on in advance:
#   static: torchrun --nnodes N --node_rank $SLURM_NODEID --master_addr A --master_port P
#   c10d:   torchrun --nnodes N --rdzv_backend c10d --rdzv_endpoint A:P --rdzv_id $SLURM_JOB_ID
# First prints "TORCHRUN_NODE {json}" (node, node id, job and step ids, master, port).
#
# c10d: torch decides which agent hosts the rendezvous store by comparing the endpoint's host
# with this machine's name and addresses. On the testbed every "node" is this one machine, named
# neither node1 nor node2, so torch guesses wrong (every agent waits for a store nobody serves);
# node 0 is therefore told explicitly with --rdzv_conf is_host=1 (others is_host=0). On a real
# cluster torch's guess is right and this is not needed.
# Reads: SLURM_NODEID, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NUM_NODES, SLURMD_NODENAME.
set -euo pipefail
mode=$1 unirank=$2 torchrun=$3 nproc=$4
shift 4
read -r addr port < <("$unirank" info --json | python3 -c \
    'import json, sys; d = json.load(sys.stdin); print(d["master_addr"], d["master_port"])')
nnodes=${SLURM_STEP_NUM_NODES:?not in an srun step}
printf 'TORCHRUN_NODE {"node": "%s", "node_id": %s, "job_id": "%s", "step_id": "%s", "master_addr": "%s", "master_port": %s}\n' \
    "${SLURMD_NODENAME:-}" "$SLURM_NODEID" "$SLURM_JOB_ID" "$SLURM_STEP_ID" "$addr" "$port"
case $mode in
    static)
        exec "$torchrun" --nnodes "$nnodes" --nproc_per_node "$nproc" --node_rank "$SLURM_NODEID" \
            --master_addr "$addr" --master_port "$port" "$@" ;;
    c10d)
        is_host=0
        [[ $SLURM_NODEID == 0 ]] && is_host=1
        exec "$torchrun" --nnodes "$nnodes" --nproc_per_node "$nproc" --rdzv_backend c10d \
            --rdzv_endpoint "$addr:$port" --rdzv_id "$SLURM_JOB_ID" \
            --rdzv_conf "is_host=$is_host,join_timeout=60,read_timeout=60" "$@" ;;
    *) echo "torchrun_node.sh: mode must be static or c10d, not $mode" >&2; exit 2 ;;
esac
