#!/usr/bin/env bash
# Thin torchrun wrapper for `gpucheck bench`: sets defaults, passes the rest through.
#
#   ./start_ddp.sh                          # every visible GPU on this node
#   N_GPUS=4 ./start_ddp.sh --dtype fp16    # extra arguments go to gpucheck bench
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 ./start_ddp.sh   # on each node
#
# Overridable from the environment: N_GPUS, NNODES, NODE_RANK, MASTER_ADDR,
# MASTER_PORT, PYTHON.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
if [[ -z "${N_GPUS:-}" ]]; then
    N_GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() or 2)')"
fi
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"

exec "$PYTHON" -m torch.distributed.run \
    --nproc-per-node "$N_GPUS" \
    --nnodes "$NNODES" \
    --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    -m gpucheck bench "$@"
