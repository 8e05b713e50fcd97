#!/bin/sh
# post-repair-gate.sh: after a repair, the node returns to service only when every one
# of its GPUs passes preflight alone (self-launched ranks, one per GPU), WARNs included.
# A node with fewer usable GPUs than it should have (one lost, or the driver not loaded,
# so preflight falls back to CPU ranks) FAILs gpu.count and stays drained. What it should
# have: $GPUCHECK_EXPECT_GPUS, else the GRES slurm.conf gives the node (Gres=gpu:8, also
# when a dead GPU no longer shows on the PCI bus), else its NVIDIA GPUs on the PCI bus.
#   post-repair-gate.sh [REPORT_DIR]
set -u
node=$(hostname -s)
if [ -z "${GPUCHECK_EXPECT_GPUS:-}" ]; then
    GPUCHECK_EXPECT_GPUS=$(scontrol show node "$node" 2>/dev/null |
        sed -n 's/.*Gres=gpu:\([A-Za-z0-9_.-]*:\)\{0,1\}\([0-9][0-9]*\).*/\2/p' | head -n 1)
    export GPUCHECK_EXPECT_GPUS
fi
dir=${1:-/var/log/gpucheck}
mkdir -p "$dir"
if gpucheck preflight --budget "${PREFLIGHT_BUDGET:-120}" --strict -q \
        -o "$dir/repair-$node.json"; then
    scontrol update NodeName="$node" State=RESUME
else
    echo "$node stays drained: see $dir/repair-$node.json" >&2
    exit 1
fi
