"""Checks of the stress area: each id declared once (see gpucheck/checks/__init__.py).

Generated from the old actions.RULES and the finding sites; edit freely from here on.
"""

from __future__ import annotations

from gpucheck.actions import Action, Status
from gpucheck.checks.check import BELOW_EXPECTED, NEVER_DRAIN, SLOW_TWICE, Cause, Check

A, W, F = Action, Status.WARN, Status.FAIL

CHECKS: tuple[Check, ...] = (
    Check("stress.copies", "Stress copies",
          "host-device copies (gpucheck stress)",
          {},
          "OK and SKIP only: information, never an action",
          "docs/stress.md#stress-copies"),
    Check("stress.copies.link", "Stress copies link",
          "host-device copies of each GPU alone against its link's rate (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "host copies alone far below the link's rate: link, slot or riser trouble to look into"
          " (NUMA placement has stress.numa)",
          "docs/stress.md#stress-copies-link",
          on_look=SLOW_TWICE),
    Check("stress.copies.together", "Stress copies together",
          "host-device copies of every GPU at once (gpucheck stress)",
          {W: A.RERUN, F: A.RERUN},
          "host copies of every GPU at once contend for shared PCIe switch uplinks and the CPU's"
          " root ports, by design unequal on PCIe boxes: slow there names no part, so never a "
          "drain on its own; stress.copies.link judges each GPU's link alone",
          "docs/stress.md#stress-copies-together",
          on_look=NEVER_DRAIN),
    Check("stress.gemm.expected", "Stress GEMM expected",
          "sustained GEMM throughput against the model's typical figure (gpucheck stress)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "below the model's typical figure (an estimate for some models): when the peers agree "
          "it is a power limit or clock setting, and a GPU worse than its peers already has a "
          "drain-node finding; draining on an optimistic figure could empty a whole fleet",
          "docs/stress.md#stress-gemm-expected",
          on_look=BELOW_EXPECTED),
    Check("stress.gemm.peers", "Stress GEMM peers",
          "sustained GEMM throughput of each GPU against its node's peers (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "slower than identical GPUs of its own node under the same sustained load: the "
          "comparison calibrates itself, so what is left is the GPU, its cooling or power",
          "docs/stress.md#stress-gemm-peers",
          on_look=SLOW_TWICE),
    Check("stress.membw.expected", "Stress memory bandwidth expected",
          "sustained memory bandwidth against the model's typical figure (gpucheck stress)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "below the model's typical figure (an estimate for some models): when the peers agree "
          "it is a power limit or clock setting, and a GPU worse than its peers already has a "
          "drain-node finding; draining on an optimistic figure could empty a whole fleet",
          "docs/stress.md#stress-membw-expected",
          on_look=BELOW_EXPECTED),
    Check("stress.membw.peers", "Stress memory bandwidth peers",
          "sustained memory bandwidth of each GPU against its node's peers (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "slower than identical GPUs of its own node under the same sustained load: the "
          "comparison calibrates itself, so what is left is the GPU, its cooling or power",
          "docs/stress.md#stress-membw-peers",
          on_look=SLOW_TWICE),
    Check("stress.numa", "Stress NUMA",
          "each rank's CPU binding under stress (gpucheck stress)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "CPU binding of the ranks is a launch setting",
          "docs/stress.md#stress-numa"),
    Check("stress.rank_record", "Stress rank record",
          "whether rank 0 could read back every rank's records (gpucheck stress; "
          "gpucheck.records)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "a record of another shape than rank 0 reads comes from a rank running another "
          "gpucheck version (or a bug): its figures are left out of the verdicts, so the fix "
          "is one version on every node, not the hardware",
          "docs/stress.md#stress-rank-record"),
    Check("stress.p2p", "Stress P2P",
          "GPU-to-GPU copy bandwidth of each pair against its path class (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "one GPU pair copies far slower than the pairs of its own path class (NV#, PXB, "
          "SYS...): an NVLink or PCIe path to look into",
          "docs/stress.md#stress-p2p",
          causes=(
              Cause("no_peer_access", A.FIX_CONFIG,
                    "peer access blocked for some pairs under one CPU socket: ACS or IOMMU "
                    "settings (pairs across sockets are refused by design and are no WARN)"),),
          on_look=SLOW_TWICE),
    Check("stress.power.limit", "Stress power limit",
          "the enforced power limit against the default (gpucheck stress)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "the enforced power limit is below the default: a setting (nvidia-smi -pl, site "
          "policy), not a fault",
          "docs/stress.md#stress-power-limit"),
    Check("stress.power.reach", "Stress power reach",
          "the power each GPU draws under GEMM against its own limit (gpucheck stress)",
          {W: A.RERUN, F: A.RERUN},
          "below DCGM's targeted-power ratio of its own limit while its peers reach theirs, in "
          "one short GEMM window: confirm (gpucheck stress again, dcgmi diag -r targeted_power) "
          "before condemning; its slowdown, if any, has the drain-node peer findings",
          "docs/stress.md#stress-power-reach"),
    Check("stress.sdc.agreement", "Stress SDC agreement",
          "the same product computed on every GPU (gpucheck stress)",
          {W: A.RERUN, F: A.DRAIN_NODE},
          "WARN: ranks differ within tolerance and no majority names one: more GPUs or a longer "
          "run decides; FAIL: one GPU computed a wrong product: silent data corruption",
          "docs/stress.md#stress-sdc-agreement",
          causes=(
              Cause("all_alike", A.FIX_CONFIG,
                    "every rank is wrong alike: the software stack, not a GPU"),)),
    Check("stress.sdc.repeat", "Stress SDC repeat",
          "the same product computed again on one GPU (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "the same product gave different results: silent data corruption",
          "docs/stress.md#stress-sdc-repeat"),
    Check("stress.sdc.software_split", "Stress SDC software split",
          "which ranks agree on the product, by node and software (gpucheck stress)",
          {W: A.FIX_CONFIG, F: A.FIX_CONFIG},
          "ranks agree among themselves (or fill whole nodes) against the rest: independent GPU "
          "faults never give the same wrong bits, so the software or its settings differ; the "
          "CPU reference says which side is right",
          "docs/stress.md#stress-sdc-software-split"),
    Check("stress.sdc.straggler", "Stress SDC straggler",
          "each GPU's time for the SDC products against its peers' (gpucheck stress)",
          {W: A.DRAIN_NODE, F: A.DRAIN_NODE},
          "slower than identical GPUs of its own node under the same sustained load: the "
          "comparison calibrates itself, so what is left is the GPU, its cooling or power",
          "docs/stress.md#stress-sdc-straggler",
          on_look=SLOW_TWICE),
)
