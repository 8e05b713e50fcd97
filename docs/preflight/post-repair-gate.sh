#!/bin/sh
# post-repair-gate.sh: after a repair, the node returns to service only when every one
# of its GPUs passes preflight alone (self-launched ranks, one per GPU), WARNs included.
# A node with fewer usable GPUs than it has on its PCI bus (one lost, or the driver not
# loaded, so preflight falls back to CPU ranks) FAILs gpu.count and stays drained.
#   post-repair-gate.sh [REPORT_DIR]
set -u
node=$(hostname -s)
dir=${1:-/var/log/gpucheck}
mkdir -p "$dir"
if gpucheck preflight --budget "${PREFLIGHT_BUDGET:-120}" --strict -q \
        -o "$dir/repair-$node.json"; then
    scontrol update NodeName="$node" State=RESUME
else
    echo "$node stays drained: see $dir/repair-$node.json" >&2
    exit 1
fi
