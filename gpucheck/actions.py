"""What to do about each WARN and FAIL: one action from a fixed list of seven.

Findings are made in many modules; their actions are decided here, in one table
(`RULES`), so the choices can be read, argued and tested side by side. A finding
gets its action when it is made (`gpucheck.report.Finding`), in this order:

1. an action passed explicitly (`warn(..., action="reset-gpu")`);
2. a hint that starts with "action: <action>: " (the kernel-log XID findings and
   the fault watcher's write it, from their per-XID and per-event tables: the
   most specific knowledge there is);
3. the most specific rule of `RULES` that matches the check id (and, where a rule
   names one, the status and a keyword of the message or hint);
4. `fallback(status)` for a check id no rule knows (tests/test_actions_coverage.py
   makes sure no check id in gpucheck/ falls through today).

OK and SKIP findings have no action.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Status(str, enum.Enum):
    """A check's verdict, ordered from best to worst by `severity`. Here beside Action
    (the two closed lists a finding is made of) so gpucheck.checks sits below report.py,
    which re-exports it."""

    OK = "OK"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.OK: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3}


class Action(str, enum.Enum):
    """The fixed list, from the least to the most disruptive."""

    NONE = "none"  # nothing to do now: information, or a count to watch
    RERUN = "rerun"  # run again: the result may be transient, or names no culprit yet
    FIX_CONFIG = "fix-config"  # software, settings or the launch: the hardware is fine
    RESTART_APP = "restart-app"  # the application's fault; the GPU is healthy
    RESET_GPU = "reset-gpu"  # nvidia-smi -r (or a reboot) clears it; the node may stay
    DRAIN_NODE = "drain-node"  # take the node out of service until someone has looked
    REPLACE_HARDWARE = "replace-hardware"  # a part is bad or unseated: hands on the box


ACTIONS: tuple[str, ...] = tuple(a.value for a in Action)
PROBLEM_STATUSES = ("WARN", "FAIL")

# "action: drain-node: drain the node and ..." (gpucheck/probes/kernel_log.py,
# gpucheck/faults/judge_*.py).
_HINT_PREFIX = re.compile(r"action: ([a-z-]+): ?")


@dataclass(frozen=True)
class Rule:
    """Check ids matching `pattern` (dotted; a `*` segment matches any one segment)
    get `action`; optionally only for one `status` or when `keyword` occurs
    (case-insensitively) in the message or hint. `why` argues the choice."""

    pattern: str
    action: Action
    why: str
    status: str | None = None
    keyword: str | None = None

    def matches(self, check: str, status: str, text: str) -> bool:
        parts, want = check.split("."), self.pattern.split(".")
        if len(parts) != len(want):
            return False
        if any(w != "*" and w != p for w, p in zip(want, parts, strict=True)):
            return False
        if self.status is not None and self.status != status:
            return False
        return self.keyword is None or self.keyword.lower() in text

    @property
    def specificity(self) -> tuple[int, int, bool, bool]:
        """More literal segments win; then more literal segments at the end, because the
        last segment says how a check ended (`*.probe` crashed, `*.interrupted`), which
        decides the action more than the namespace does (`torch.*`); then a keyword,
        then a status."""
        segments = self.pattern.split(".")
        trailing = len(segments) - max((i + 1 for i, s in enumerate(segments) if s == "*"),
                                       default=0)
        literal = sum(1 for s in segments if s != "*")
        return literal, trailing, self.keyword is not None, self.status is not None


A = Action
_SHORT_RUN = ("one short measurement: contention from other jobs, a cold start or the "
              "host's CPU can explain it, so confirm before acting; the hint says where "
              "to look when it repeats")
_PEERS = ("slower than identical GPUs of its own node under the same sustained load: the "
          "comparison calibrates itself, so what is left is the GPU, its cooling or power")

_CONFIRMED = ("slow twice, the second time measured beside known-good peers (pairs, "
              "nodes or GPUs the first measurement cleared) in the same run: contention "
              "and transients would have slowed those too, so the link, NIC or GPU is "
              "the suspect; out of service until someone has looked, as stress's peers")
_UNCONFIRMED = ("below its bound once and not measured again (the run stopped first, or "
                "an older report): nothing is condemned on one measurement")

RULES: tuple[Rule, ...] = (
    # How a run ended, whatever it checked.
    Rule("*.probe", A.RERUN, "a probe crashed or hung: gpucheck's own trouble, not a "
         "verdict on the machine; run again and report a bug if it repeats"),
    Rule("*.interrupted", A.RERUN, "the run was stopped (Ctrl-C, a time limit): nothing "
         "was judged wrong, the rest was not measured"),
    Rule("*.failed", A.RERUN, "the run failed with no rank to blame: read the ranks' "
         "output, then run again"),
    Rule("all.*.failed", A.RERUN, "one command of `gpucheck all` stopped with an error, "
         "the others ran: run that command alone to see the whole error"),
    Rule("*.rank_failed", A.RERUN, "a rank exited early, often because another one "
         "stopped answering; the hardware findings (faults, XIDs) carry their own actions"),
    Rule("*.rank_unresponsive", A.RERUN, "a rank stopped answering and was killed; the "
         "fault watcher and kernel log say whether its GPU hung"),
    Rule("*.checkin", A.FIX_CONFIG, "a rank never started or never reached the rendezvous: "
         "the launch (every node started, the same endpoint) is wrong, and running the "
         "same command again fails the same way"),
    Rule("*.shared_gpu", A.FIX_CONFIG, "two ranks picked one GPU (the launch's GPU binding "
         "or CUDA_VISIBLE_DEVICES overlaps): the launch is wrong, not the GPU"),
    # Driver and NVML.
    Rule("driver.nvml", A.FIX_CONFIG, "the driver or nvidia-ml-py is missing, not loaded, "
         "mismatched (reboot after an upgrade) or not permitted: installation, not hardware"),
    Rule("driver.nvml", A.DRAIN_NODE, "NVML itself says a GPU fell off the bus", "FAIL",
         "is lost"),
    Rule("driver.nvml", A.RESET_GPU, "NVML says a GPU needs a reset", "FAIL", "needs a reset"),
    Rule("driver.nvml", A.RESET_GPU, "the driver timed out: a wedged GPU, which a reset "
         "clears", "FAIL", "timed out"),
    Rule("driver.nvml", A.RESET_GPU, "the driver did not answer: a wedged GPU, which a "
         "reset clears", "FAIL", "no answer"),
    Rule("driver.nvml_slow", A.NONE, "an NVML call answered late but answered: nothing is "
         "missing, and a late answer is mostly the driver busy elsewhere on the node; "
         "only a call that misses a second, longer budget is a hang"),
    Rule("driver.nvml_hang", A.DRAIN_NODE, "an NVML call never came back: the driver is "
         "wedged, jobs would hang too, and the usual cure is a reboot"),
    Rule("driver.cuda_compat", A.FIX_CONFIG, "the driver is older than torch's CUDA: "
         "upgrade the driver or install a matching torch"),
    # Per GPU (nvidia-smi -q).
    Rule("gpu.lost", A.DRAIN_NODE, "fell off the bus (Xid 79): a reset in place rarely "
         "works, the node needs a reboot or power-cycle and the cause (power, PCIe, "
         "the GPU) a look; as the kernel-log and fault-watcher findings decide"),
    Rule("gpu.query", A.RESET_GPU, "the GPU stopped answering queries (reset required, "
         "timeouts): a reset is the first cure"),
    Rule("gpu.query", A.FIX_CONFIG, "a permission problem, not the GPU",
         keyword="not permitted"),
    Rule("gpu.busy", A.RERUN, "another process shares the GPU: measure again when it is "
         "idle; the GPU is not at fault"),
    Rule("gpu.pcie.width", A.REPLACE_HARDWARE, "a narrower link than the slot's is a "
         "seating, riser or slot fault: hands on the box (reseat, then replace); as the "
         "fault watcher's PCIe-replay WARN"),
    Rule("gpu.ecc.volatile_uncorrected", A.DRAIN_NODE, "a double-bit (uncorrectable) ECC "
         "error corrupts data: take the node out until the GPU is reset and checked"),
    Rule("gpu.ecc.aggregate_uncorrected", A.NONE, "lifetime count, history not news: "
         "watch it; the volatile counter and row remapping judge the present"),
    Rule("gpu.retired_pages.pending", A.RESET_GPU, "the retirement takes effect at the "
         "next reset"),
    Rule("gpu.remapped_rows.pending", A.RESET_GPU, "the row remap takes effect at the next "
         "reset; until then the bad row stays in use"),
    Rule("gpu.bank_remap.pending", A.RESET_GPU, "the bank remap takes effect at the next "
         "reset, as a pending row remap"),
    Rule("gpu.remapped_rows.failed", A.REPLACE_HARDWARE, "the GPU has no spare rows left "
         "to remap: it needs an RMA"),
    Rule("gpu.clocks.event_reasons", A.DRAIN_NODE, "thermal or power-brake slowdown: "
         "cooling or power needs a look and slows every job; as the fault watcher's "
         "faults.clocks.slowdown"),
    Rule("gpu.persistence_mode", A.FIX_CONFIG, "a driver setting (nvidia-smi -pm 1, "
         "nvidia-persistenced)"),
    Rule("gpu.mig_mode", A.RESET_GPU, "a pending MIG change takes effect at the next reset"),
    Rule("gpu.fabric", A.FIX_CONFIG, "the NVSwitch fabric manager is not running or does "
         "not match the driver"),
    Rule("gpu.fabric", A.RERUN, "registration is still going on (a minute after boot)",
         keyword="still in progress"),
    Rule("gpu.fabric.health", A.DRAIN_NODE, "NVML's own summary says the NVSwitch fabric "
         "is unhealthy or at limited capacity: out of service until the fabric is checked"),
    Rule("gpu.fabric.degraded_bandwidth", A.DRAIN_NODE, "NVLink bandwidth through the "
         "fabric is degraded: every collective is slower until the link or switch is fixed"),
    Rule("gpu.fabric.route_unhealthy", A.DRAIN_NODE, "a fabric route is unhealthy: NVLink "
         "traffic to some peers can fail"),
    Rule("gpu.fabric.recovering", A.RERUN, "the fabric is recovering a route or an access "
         "timeout by itself: look again when it has finished"),
    Rule("gpu.fabric.configuration", A.FIX_CONFIG, "the fabric names a configuration error "
         "(system GUID, chassis serial, partition, firmware, location)"),
    Rule("gpu.fabric.configuration", A.DRAIN_NODE, "too few NVLinks came up to join the "
         "fabric: a hardware fault", keyword="INSUFFICIENT_NVLINKS"),
    Rule("gpu.recovery_action", A.DRAIN_NODE, "NVML asks for a node reboot, a drain (of P2P "
         "traffic, or before a reset), an IMEX-domain recovery, or an action gpucheck does "
         "not know: the node must stop taking work"),
    Rule("gpu.recovery_action", A.RESET_GPU, "NVML asks for a GPU reset: nvidia-smi -r "
         "clears it, the node may stay", keyword="RECOVERY_ACTION_GPU_RESET"),
    Rule("gpu.recovery_action", A.RESET_GPU, "NVML asks for a reset of the GPU's PCIe bus",
         keyword="RECOVERY_ACTION_BUS_RESET"),
    Rule("gpu.topology", A.RERUN, "a topology query failed after every GPU answered: "
         "transient until it repeats"),
    Rule("gpu.topology", A.RESET_GPU, "a GPU stopped answering, as for gpu.query",
         keyword="no answer"),
    Rule("gpu.topology", A.RESET_GPU, "a GPU's driver call timed out, as for gpu.query",
         keyword="timed out"),
    Rule("gpu.arch_supported", A.FIX_CONFIG, "this torch build lacks kernels for the GPU: "
         "install another torch or upgrade the driver"),
    Rule("gpu.functional", A.DRAIN_NODE, "the GPU computed a wrong product, raised or hung "
         "on a small test: it must not take jobs until reset and diagnosed"),
    # gpucheck health: the GPU count and the InfiniBand/RoCE ports (docs/health.md).
    Rule("gpu.count", A.DRAIN_NODE, "fewer GPUs than the node should have: one fell off the "
         "bus or failed to initialise; jobs sized for the node cannot run", "FAIL"),
    Rule("gpu.count", A.FIX_CONFIG, "more GPUs than expected, or fewer than the PCI bus shows "
         "with no count given: state the node's count (--expect-gpus) to judge it", "WARN"),
    Rule("ib.ports", A.DRAIN_NODE, "fewer active InfiniBand/RoCE ports than the node should "
         "have: multi-node jobs lose a rail or cannot start"),
    Rule("ib.port.state", A.DRAIN_NODE, "a port this node has seen active is down: NCCL over "
         "that rail fails or falls back until the link is fixed", "FAIL"),
    Rule("ib.port.state", A.FIX_CONFIG, "a port never seen active is down or not configured: "
         "an unused port to disable or ignore, or a subnet manager to start", "WARN"),
    Rule("ib.port.rate", A.REPLACE_HARDWARE, "a port trained to a lower rate than its peers: "
         "a cable, transceiver or switch port to reseat or replace; as gpu.pcie.width"),
    Rule("ib.port.link_downed", A.DRAIN_NODE, "the link went down and retrained since the "
         "last check: a flapping link breaks NCCL jobs at random until it is looked at"),
    Rule("health.state", A.FIX_CONFIG, "the state dir could not be read or written: disk "
         "space or rights; the checks themselves ran"),
    # Software and environment.
    Rule("system.shm", A.FIX_CONFIG, "/dev/shm is a container or mount setting"),
    Rule("torch.*", A.FIX_CONFIG, "the torch installation (CPU-only, no cuDNN or NCCL, "
         "CUDA unavailable for a driver or fabric reason): software"),
    Rule("python.*", A.FIX_CONFIG, "the Python environment (torch's origin, torchvision)"),
    Rule("python.deprecated.*", A.FIX_CONFIG, "a deprecated package to uninstall"),
    Rule("consistency.*", A.FIX_CONFIG, "NVML, CUDA and CUDA_VISIBLE_DEVICES disagree, or "
         "the GPUs of one node differ in settings: configuration"),
    Rule("env.nodes.differ", A.FIX_CONFIG, "nodes of one job differ in drivers, packages "
         "or environment"),
    Rule("ranks.numa", A.FIX_CONFIG, "CPU binding of the ranks is a launch setting"),
    Rule("launch.cpu_ranks", A.FIX_CONFIG, "more CPU ranks than cores is a launch setting"),
    # bench.
    Rule("bench.images.skipped", A.FIX_CONFIG, "an unreadable input image: fix or remove "
         "the file"),
    Rule("bench.rank.straggler", A.RERUN, f"a slow rank in {_SHORT_RUN}"),
    Rule("bench.rank.straggler", A.FIX_CONFIG, "the rank computed at speed and held the job "
         "back because its host did not run it (a CPU quota, a competing or stopped "
         "process, a data loader): the host's settings or load, not the hardware",
         keyword="its host did not run it"),
    Rule("bench.node.slow", A.RERUN, f"a slow node in {_SHORT_RUN}"),
    Rule("bench.consistency", A.DRAIN_NODE, "a rank computed wrong logits: a GPU that "
         "gives wrong answers must not take jobs until diagnosed (dcgmi diag)"),
    Rule("bench.consistency", A.FIX_CONFIG, "every rank is wrong alike: the software stack "
         "or the tolerance, not a GPU", keyword="suspect the software"),
    Rule("bench.consistency", A.RERUN, "ranks disagree and nothing names the odd one: more "
         "GPUs decide", "WARN"),
    # comm.
    Rule("comm.*.correct", A.DRAIN_NODE, "a collective gave wrong sums: silent data "
         "corruption on a GPU or link"),
    Rule("comm.*.busbw_baseline", A.RERUN, "job-wide bandwidth below the given baseline "
         "names no node to drain and shares the fabric with other jobs; "
         "comm.pairwise.slow_pair, comm.nodes.slow_node and the faults section localise "
         "it, with their own actions"),
    Rule("comm.pairwise.slow_pair", A.RERUN, f"a slow GPU pair in {_SHORT_RUN}"),
    Rule("comm.nodes.slow_node", A.RERUN, f"a slow node in {_SHORT_RUN}"),
    Rule("comm.internode.slow_pair", A.RERUN, f"a slow node-to-node link in {_SHORT_RUN}"),
    Rule("comm.internode.slow_rail", A.RERUN, f"one slow NIC-to-NIC link in {_SHORT_RUN}"),
    Rule("comm.internode.shared_node", A.RERUN, "several slow node pairs share one node: "
         f"a suspect, still from {_SHORT_RUN}"),
    # Confirmed: slow twice, the second time beside known-good peers measured with it.
    Rule("comm.pairwise.slow_pair", A.RERUN, "CPU ranks: a confirmed slow pair is a busy "
         "or throttled process, not a link", "WARN", "cpu ranks exchange"),
    Rule("comm.pairwise.slow_pair", A.DRAIN_NODE, _CONFIRMED, keyword="confirmed:"),
    Rule("comm.nodes.slow_node", A.DRAIN_NODE, _CONFIRMED, keyword="confirmed:"),
    Rule("comm.internode.slow_pair", A.DRAIN_NODE, _CONFIRMED, keyword="confirmed:"),
    Rule("comm.internode.slow_rail", A.DRAIN_NODE, _CONFIRMED, keyword="confirmed:"),
    Rule("comm.internode.shared_node", A.DRAIN_NODE, _CONFIRMED, keyword="confirmed:"),
    Rule("comm.transport.*", A.FIX_CONFIG, "NCCL chose sockets or a loopback/bridge "
         "interface: its settings or the container's RDMA libraries, not the hardware"),
    # stress: sustained load, built to reproduce what it finds.
    Rule("stress.*.peers", A.DRAIN_NODE, _PEERS),
    Rule("stress.sdc.straggler", A.DRAIN_NODE, _PEERS),
    Rule("stress.copies.together", A.RERUN, "host copies of every GPU at once contend "
         "for shared PCIe switch uplinks and the CPU's root ports, by design unequal on "
         "PCIe boxes: slow there names no part, so never a drain on its own; "
         "stress.copies.link judges each GPU's link alone"),
    Rule("stress.*.expected", A.FIX_CONFIG, "below the model's typical figure (an estimate "
         "for some models): when the peers agree it is a power limit or clock setting, and "
         "a GPU worse than its peers already has a drain-node finding; draining on an "
         "optimistic figure could empty a whole fleet"),
    Rule("stress.copies.link", A.DRAIN_NODE, "host copies alone far below the link's rate: "
         "link, slot or riser trouble to look into (NUMA placement has stress.numa)"),
    Rule("stress.sdc.repeat", A.DRAIN_NODE, "the same product gave different results: "
         "silent data corruption"),
    Rule("stress.sdc.agreement", A.DRAIN_NODE, "one GPU computed a wrong product: silent "
         "data corruption"),
    Rule("stress.sdc.agreement", A.FIX_CONFIG, "every rank is wrong alike: the software "
         "stack, not a GPU", keyword="suspect the software"),
    Rule("stress.sdc.software_split", A.FIX_CONFIG, "ranks agree among themselves (or fill "
         "whole nodes) against the rest: independent GPU faults never give the same wrong "
         "bits, so the software or its settings differ; the CPU reference says which side "
         "is right"),
    Rule("stress.sdc.agreement", A.RERUN, "ranks differ within tolerance and no majority "
         "names one: more GPUs or a longer run decides", "WARN"),
    Rule("stress.p2p", A.DRAIN_NODE, "one GPU pair copies far slower than the pairs of its "
         "own path class (NV#, PXB, SYS...): an NVLink or PCIe path to look into"),
    Rule("stress.p2p", A.FIX_CONFIG, "peer access blocked for some pairs under one CPU "
         "socket: ACS or IOMMU settings (pairs across sockets are refused by design and "
         "are no WARN)", keyword="without peer access"),
    Rule("stress.power.reach", A.RERUN, "below DCGM's targeted-power ratio of its own limit "
         "while its peers reach theirs, in one short GEMM window: confirm (gpucheck stress "
         "again, dcgmi diag -r targeted_power) before condemning; its slowdown, if any, "
         "has the drain-node peer findings"),
    Rule("stress.power.limit", A.FIX_CONFIG, "the enforced power limit is below the "
         "default: a setting (nvidia-smi -pl, site policy), not a fault"),
    Rule("stress.numa", A.FIX_CONFIG, "CPU binding of the ranks is a launch setting"),
    # Not measured again (a run stopped in between, an older report): nothing confirmed.
    *(Rule(check, A.RERUN, _UNCONFIRMED, keyword="not measured again") for check in (
        "stress.*.peers", "stress.sdc.straggler", "stress.copies.together",
        "stress.copies.link", "stress.p2p")),
    # hang: a stuck job, the rank the others wait for (docs/hang.md).
    Rule("hang.rank.*", A.RESTART_APP, "the job cannot go on without this rank (dead, "
         "stopped, in its own code or another collective): restart the job once its log "
         "or stack says why; the GPU is not blamed, the fault findings would"),
    Rule("hang.rank.d_state", A.DRAIN_NODE, "a process in uninterruptible sleep for the "
         "whole window waits on a driver or file-system call that does not return: the "
         "node needs a look (dmesg), and the next job would hang the same way"),
    Rule("hang.rank.unreadable", A.FIX_CONFIG, "the others wait for a rank whose stack "
         "could not be read: grant the ptrace capability and look again"),
    Rule("hang.verdict", A.RERUN, "stuck, but no rank of this node to blame: look at "
         "every node at once (or read the Flight Recorder dumps) to find it"),
    Rule("hang.traces.*", A.RESTART_APP, "the dumps show ranks that disagree on the "
         "collectives or never reached one: the program's order of collectives or a rank "
         "that stopped: fix or restart the job"),
)


def hint_action(hint: str | None) -> str | None:
    """The action a hint names in its "action: <action>: " prefix, if one of ACTIONS."""
    match = _HINT_PREFIX.match(hint or "")
    return match[1] if match and match[1] in ACTIONS else None


def strip_hint(hint: str | None, action: str | None) -> str | None:
    """The hint without an "action: <action>: " prefix that only repeats `action`
    (the renderers show the action on its own)."""
    match = _HINT_PREFIX.match(hint or "")
    if hint is None or match is None or match[1] != action:
        return hint
    return hint[match.end():]


def rule_for(check: str, status: str, message: str = "",
             hint: str | None = None) -> Rule | None:
    """The most specific matching rule (the first of equals in RULES), or None."""
    text = f"{message}\n{hint or ''}".lower()
    matching = [r for r in RULES if r.matches(check, status, text)]
    return max(matching, key=lambda r: r.specificity, default=None)


def fallback(status: str) -> Action:
    """For a check id no rule knows. A FAIL drains the node: an unexplained failure must
    not keep taking jobs until a person has read its hint. A WARN is run again: cheap,
    and it tells a passing glitch from a lasting problem."""
    return Action.DRAIN_NODE if status == "FAIL" else Action.RERUN


def resolve_action(check: str, status: str, message: str = "",
                   hint: str | None = None) -> str | None:
    """The action of a finding made without one (None for OK and SKIP)."""
    if status not in PROBLEM_STATUSES:
        return None
    named = hint_action(hint)
    if named is not None:
        return named
    rule = rule_for(check, status, message, hint)
    return (rule.action if rule is not None else fallback(status)).value
