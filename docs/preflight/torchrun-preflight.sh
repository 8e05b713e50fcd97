#!/bin/sh
# torchrun-preflight.sh: torchrun with gpucheck's gate in front of the job's command.
#   NNODES=4 NPROC_PER_NODE=8 RDZV_ENDPOINT=head:29400 ./torchrun-preflight.sh python train.py --lr 3e-4
# Run it on every node; on a pass each rank's process becomes the command.
set -eu
exec torchrun --nnodes "${NNODES:-1}" --nproc-per-node "${NPROC_PER_NODE:-gpu}" \
    --rdzv-backend c10d --rdzv-endpoint "${RDZV_ENDPOINT:-127.0.0.1:29400}" \
    --max-restarts 0 \
    -m gpucheck preflight --budget "${PREFLIGHT_BUDGET:-60}" \
    --exclude-file "${PREFLIGHT_EXCLUDE:-preflight-exclude.txt}" -- "$@"
