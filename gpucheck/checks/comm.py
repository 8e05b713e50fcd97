"""Checks of the comm area: each id declared once (see gpucheck/checks/__init__.py).

Every slow figure of comm (a GPU pair, a node, a node pair, a rail link, the node they
share) is one WARN made by `gpucheck.comm.looks.slow`, with its second look as data:
`on_look` (SLOW_TWICE) decides it, confirmed `drain-node`, unstable and not measured
again `rerun`; cause `cpu_ranks` (set on CPU ranks) outranks the look: `rerun`.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import SLOW_TWICE, Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL
_CPU_RANKS = Cause("cpu_ranks", A.RERUN, "CPU ranks: a slow link or node is a busy or "
                   "throttled process, not a NIC or a GPU")

CHECKS: tuple[Check, ...] = (
    Check("comm.internode.shared_node", "Comm internode shared node",
          "node-to-node and NIC-to-NIC bandwidth (gpucheck comm; nccl-tests by hand)",
          {W: A.RERUN, F: A.RERUN},
          "several slow node pairs share one node: a suspect, still from one short measurement: "
          "contention from other jobs, a cold start or the host's CPU can explain it, so confirm"
          " before acting; the hint says where to look when it repeats",
          "docs/comm.md#comm-internode-shared-node",
          causes=(_CPU_RANKS,),
          on_look=SLOW_TWICE),
    Check("comm.internode.slow_pair", "Comm internode slow pair",
          "node-to-node and NIC-to-NIC bandwidth (gpucheck comm; nccl-tests by hand)",
          {W: A.RERUN, F: A.RERUN},
          "a slow node-to-node link in one short measurement: contention from other jobs, a cold"
          " start or the host's CPU can explain it, so confirm before acting; the hint says "
          "where to look when it repeats",
          "docs/comm.md#comm-internode-slow-pair",
          causes=(_CPU_RANKS,),
          on_look=SLOW_TWICE),
    Check("comm.internode.slow_rail", "Comm internode slow rail",
          "node-to-node and NIC-to-NIC bandwidth (gpucheck comm; nccl-tests by hand)",
          {W: A.RERUN, F: A.RERUN},
          "one slow NIC-to-NIC link in one short measurement: contention from other jobs, a cold"
          " start or the host's CPU can explain it, so confirm before acting; the hint says "
          "where to look when it repeats",
          "docs/comm.md#comm-internode-slow-rail",
          causes=(_CPU_RANKS,),
          on_look=SLOW_TWICE),
    Check("comm.nodes.slow_node", "Comm nodes slow node",
          "each node's collective bandwidth against the others' (gpucheck comm; nccl-tests by "
          "hand)",
          {W: A.RERUN, F: A.RERUN},
          "a slow node in one short measurement: contention from other jobs, a cold start or the"
          " host's CPU can explain it, so confirm before acting; the hint says where to look "
          "when it repeats",
          "docs/comm.md#comm-nodes-slow-node",
          causes=(_CPU_RANKS,),
          on_look=SLOW_TWICE),
    Check("comm.rank_record", "Comm rank record",
          "whether rank 0 could read back every rank's records (gpucheck comm; "
          "gpucheck.records)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "a record of another shape than rank 0 reads comes from a rank running another "
          "gpucheck version (or a bug): its figures are left out of the verdicts, so the fix "
          "is one version on every node, not the hardware",
          "docs/comm.md#comm-rank-record"),
    Check("comm.pairwise.slow_pair", "Comm pairwise slow pair",
          "send/recv bandwidth of every GPU pair (gpucheck comm; nccl-tests by hand)",
          {W: A.RERUN, F: A.RERUN},
          "a slow GPU pair in one short measurement: contention from other jobs, a cold start or"
          " the host's CPU can explain it, so confirm before acting; the hint says where to look"
          " when it repeats",
          "docs/comm.md#comm-pairwise-slow-pair",
          causes=(
              Cause("cpu_ranks", A.RERUN,
                    "CPU ranks: a confirmed slow pair is a busy or throttled process, "
                    "not a link", W),),
          on_look=SLOW_TWICE),
    Check("comm.transport.bad_interface", "Comm transport bad interface",
          "the transport and interface NCCL chose (gpucheck comm; nccl-tests by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "NCCL chose sockets or a loopback/bridge interface: its settings or the container's "
          "RDMA libraries, not the hardware",
          "docs/comm.md#comm-transport-bad-interface"),
    Check("comm.transport.sockets_with_ib", "Comm transport sockets with InfiniBand",
          "the transport and interface NCCL chose (gpucheck comm; nccl-tests by hand)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "NCCL chose sockets or a loopback/bridge interface: its settings or the container's "
          "RDMA libraries, not the hardware",
          "docs/comm.md#comm-transport-sockets-with-ib"),
    Check("comm.{op}.busbw_baseline", "Comm <collective> bus bandwidth baseline",
          "a collective's bus bandwidth against the given baseline (gpucheck comm; nccl-tests by"
          " hand)",
          {W: A.RERUN, F: A.RERUN},
          "job-wide bandwidth below the given baseline names no node to drain and shares the "
          "fabric with other jobs; comm.pairwise.slow_pair, comm.nodes.slow_node and the faults "
          "section localise it, with their own actions",
          "docs/comm.md#comm-op-busbw-baseline"),
    Check("comm.{op}.correct", "Comm <collective> correct",
          "the sums a collective returned (gpucheck comm; nccl-tests by hand)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "a collective gave wrong sums: silent data corruption on a GPU or link",
          "docs/comm.md#comm-op-correct"),
)
