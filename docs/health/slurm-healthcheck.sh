#!/bin/sh
# SLURM HealthCheckProgram for gpucheck (docs/health.md).
#
# slurm.conf:
#   HealthCheckProgram=/usr/local/sbin/gpucheck-healthcheck.sh
#   HealthCheckInterval=300
#   HealthCheckNodeState=ANY,CYCLE
#
# slurmd runs this as root and acts on nothing but what it does itself (slurm.conf(5):
# "Any action to be taken must be explicitly performed by the program"), so:
# - a problem (exit 1 under --convention npd): drain the node, the reason being
#   gpucheck's one line (the worst problem, its GPU or port, its action);
# - all clear (exit 0): resume the node, but only when gpucheck drained it (its reason
#   starts with "gpucheck health"): a drain set by a person stays;
# - gpucheck could not tell (exit 2: a check did not finish in its budget, or a bad
#   option): change nothing and say so on stderr (slurmd logs it).
# Two problems gpucheck itself makes a FAIL, so this drains for them as for any other:
# - a state file it cannot read (damaged, a newer gpucheck's): the node is not known to
#   be healthy, and stays drained until an administrator runs
#   `gpucheck health --set-healthy --state-dir $STATE_DIR` (the drain reason says so);
# - fewer GPUs than the node should have (--expect-gpus in GPUCHECK_HEALTH_ARGS, else
#   the NVIDIA GPUs on its PCI bus, or fewer than an earlier check saw): drained until
#   NVML shows them all again.
# It always exits 0: slurmd kills it after 60 s, and the budget keeps it far below.
GPUCHECK=${GPUCHECK:-gpucheck}
STATE_DIR=${GPUCHECK_STATE_DIR:-/var/lib/gpucheck}
NODE=${GPUCHECK_NODE:-$(hostname -s)}

# shellcheck disable=SC2086  # GPUCHECK_HEALTH_ARGS holds several options on purpose
reason=$("$GPUCHECK" health --format line --convention npd --budget 10 \
         --state-dir "$STATE_DIR" --consumer slurm-healthcheck $GPUCHECK_HEALTH_ARGS)
status=$?
case $status in
0)
    current=$(sinfo --noheader --nodes="$NODE" --format=%E 2>/dev/null)
    case $current in
    "gpucheck health"*) scontrol update nodename="$NODE" state=resume ;;
    esac
    ;;
1)
    scontrol update nodename="$NODE" state=drain reason="$reason"
    ;;
*)
    echo "gpucheck health could not judge $NODE (exit $status): $reason" >&2
    ;;
esac
exit 0
