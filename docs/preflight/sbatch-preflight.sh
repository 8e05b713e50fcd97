#!/bin/bash
# sbatch-preflight.sh: the job's own allocation checked before the first step; a node
# that fails is excluded and the job resubmitted once without it.
#   sbatch sbatch-preflight.sh --lr 3e-4          (arguments go to train.py)
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=04:00:00
set -u

job=${SLURM_JOB_ID:-local}
exclude=${PREFLIGHT_EXCLUDE:-preflight-exclude.$job}   # on a shared file system
script=${PREFLIGHT_SCRIPT:-$(scontrol show job "$job" | sed -n 's/^ *Command=//p')}
MASTER_ADDR=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" | head -n 1)
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-29500}

# Every task runs the checks; on a pass each becomes `python train.py` (same PID, the
# SLURM variables untouched); on a fail none starts and the exclude file names the
# failing hosts (it is written, possibly empty, in any case).
srun gpucheck preflight --budget "${PREFLIGHT_BUDGET:-60}" --exclude-file "$exclude" \
    -o "preflight-$job.json" -- python train.py "$@"
status=$?

if [ "$status" -ne 0 ] && [ -s "$exclude" ] && [ -z "${PREFLIGHT_RESUBMITTED:-}" ]; then
    nodes=$(paste -sd, "$exclude")
    echo "preflight failed on $nodes: resubmitting once without them" >&2
    sbatch --exclude="$nodes" --export=ALL,PREFLIGHT_RESUBMITTED=1 "$script" "$@"
fi
exit "$status"
