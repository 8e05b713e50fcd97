#!/usr/bin/env bash
# Thin torchrun wrapper for `gpucheck bench`: sets defaults, passes the rest through.
#
#   ./start_ddp.sh                          # every visible GPU on this node
#   N_GPUS=4 ./start_ddp.sh --dtype fp16    # extra arguments go to gpucheck bench
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 ./start_ddp.sh   # on each node
#
# Overridable from the environment: N_GPUS, NNODES, NODE_RANK, MASTER_ADDR,
# MASTER_PORT, PYTHON (default: this checkout's .venv/bin/python when it exists,
# else python3).
set -euo pipefail

# The checkout's own virtual environment (README quick start) when there is one, so the
# wrapper works without activating it.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" && -x "$here/.venv/bin/python" ]]; then
    PYTHON="$here/.venv/bin/python"
fi
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import torch, gpucheck' 2>/dev/null; then
    echo "start_ddp.sh: $PYTHON cannot import torch and gpucheck: run the README's quick" \
         "start first (python3 -m venv .venv && .venv/bin/pip install .), or set PYTHON" >&2
    exit 2
fi
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
