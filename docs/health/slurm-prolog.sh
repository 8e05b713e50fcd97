#!/bin/sh
# SLURM Prolog for gpucheck (docs/health.md): before a job starts on this node.
#
# slurm.conf:
#   Prolog=/usr/local/sbin/gpucheck-prolog.sh
#   PrologFlags=Alloc
#
# A prolog that exits non-zero drains the node and requeues the job (slurm.conf(5)),
# but the drain reason Slurm writes then is its own; so on a problem this drains the
# node itself with gpucheck's one line, then exits 1. A short budget: every job waits
# for it. Under --convention slurm an unknown (a check that did not finish) exits 0:
# a job is never refused because gpucheck could not tell. A state file it cannot read
# (not known to be healthy until `gpucheck health --set-healthy`) and fewer GPUs than
# the node should have (its PCI bus, SLURM's GRES for the job, --expect-gpus) are FAILs:
# drained, the job requeued.
GPUCHECK=${GPUCHECK:-gpucheck}
STATE_DIR=${GPUCHECK_STATE_DIR:-/var/lib/gpucheck}
NODE=${GPUCHECK_NODE:-$(hostname -s)}

# shellcheck disable=SC2086
reason=$("$GPUCHECK" health --format line --convention slurm --budget 3 \
         --state-dir "$STATE_DIR" --consumer slurm-prolog $GPUCHECK_HEALTH_ARGS)
status=$?
if [ "$status" -eq 1 ]; then
    scontrol update nodename="$NODE" state=drain reason="$reason"
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "gpucheck health could not run on $NODE (exit $status): $reason" >&2
fi
exit 0
