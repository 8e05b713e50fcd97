#!/bin/sh
# node_exporter textfile collector for gpucheck (docs/health.md): run it every few
# minutes (cron: */5 * * * * root /usr/local/sbin/gpucheck-textfile.sh), and start
# node_exporter with --collector.textfile.directory=/var/lib/node_exporter/textfile.
#
# -o FILE.prom picks the Prometheus format and writes it atomically (a temp file in the
# same directory, then a rename: the collector never reads half a file; its temp name
# does not end in .prom, so the collector ignores it). The directory must be root's and
# writable by no one else (chown root; chmod 755: node_exporter only reads it): as root,
# gpucheck refuses to write where another user could plant a link (exit 2).
# The exit code is not needed:
# the verdict is in the metrics, and a run that writes nothing leaves
# gpucheck_valid_until_timestamp_seconds to go stale, which the alert rules catch.
# A state file it cannot read, and fewer GPUs than the node should have, are FAILs
# (gpucheck_check_status{check="health.state"} and {check="gpu.count"} at 3): the FAIL
# alert fires until an administrator runs `gpucheck health --set-healthy` or the GPUs
# are back.
GPUCHECK=${GPUCHECK:-gpucheck}
STATE_DIR=${GPUCHECK_STATE_DIR:-/var/lib/gpucheck}
TEXTFILE_DIR=${TEXTFILE_DIR:-/var/lib/node_exporter/textfile}

# shellcheck disable=SC2086
"$GPUCHECK" health --budget 10 --valid-for 900 --state-dir "$STATE_DIR" \
    --consumer prometheus-textfile \
    --output "$TEXTFILE_DIR/gpucheck.prom" --quiet $GPUCHECK_HEALTH_ARGS
exit 0
