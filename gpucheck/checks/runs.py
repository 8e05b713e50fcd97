"""The checks of the commands' runs, one row each: how a run ended, preflight, bench,
comm, stress, hang, fleet and compare. Titles and docs anchors come from the id
unless given (check.py)."""

from __future__ import annotations

from gpucheck.checks.check import INFO, SITE, Action, Cause, Check, Status, both, how
from gpucheck.measure import LookState

A, W, F = Action, Status.WARN, Status.FAIL
# A second look: unstable (fine when measured again) asks nothing, "act only if it
# repeats" is no WARN (issue 36 item 4). Slow twice, the second time beside known-good
# peers, drains: contention would have slowed those too; not measured again condemns
# nothing. Below the model's typical figure (an estimate) is a setting when it holds;
# copies of every GPU at once contend by design: never a drain, whatever the look.
_C, _U, _N = LookState.CONFIRMED, LookState.UNSTABLE, LookState.NOT_MEASURED
SLOW_TWICE = {_C: A.DRAIN_NODE, _U: None, _N: A.RERUN}
BELOW_EXPECTED = {_C: A.FIX_CONFIG, _U: None, _N: A.FIX_CONFIG}
NEVER_DRAIN = {_C: A.RERUN, _U: None, _N: A.RERUN}
_STRESS = how("gpucheck stress")
_HANG = how("gpucheck hang; py-spy dump by hand")
_COMPARE = how("gpucheck compare A.json B.json")
_BENCH = how("gpucheck bench")
_ENDED = how("every command: how the run itself ended")
_COMM = how("gpucheck comm; nccl-tests by hand")
_FLEET = how("gpucheck fleet DIR")
_PREFLIGHT = how("gpucheck preflight")
_JOBS = _HANG("the jobs and stacks on this node")
_METRICS = "the run's metrics against a saved baseline (gpucheck <command> --baseline FILE)"
_SETTINGS = _COMPARE("versions, environment and settings of A and B")
_DUMPS = _HANG("the NCCL Flight Recorder dumps of the job")
_INTERNODE = _COMM("node-to-node and NIC-to-NIC bandwidth")
_BELOW_EXPECTED = ("below the model's typical figure (an estimate for some models): when the "
                   "peers agree it is a power limit or clock setting, and a GPU worse than its "
                   "peers already has a drain-node finding; draining on an optimistic figure "
                   "could empty a whole fleet")
_BINDING = "CPU binding of the ranks is a launch setting"
_CHANGED = ("B's software or settings changed from A's: align them if the change was not intended "
            "(the action compare has always given this finding)")
_FALLBACK = ("WARN: no rule today: gpucheck's fallback for an unknown id (run again: cheap, and "
             "it tells a glitch from a lasting problem); FAIL: no rule today: gpucheck's fallback "
             "for an unknown id (an unexplained failure must not keep taking jobs)")
_PEERS = ("slower than identical GPUs of its own node under the same sustained load: the "
          "comparison calibrates itself, so what is left is the GPU, its cooling or power")
_RECORD = ("a record of another shape than rank 0 reads comes from a rank running another "
           "gpucheck version (or a bug): its figures are left out of the verdicts, so the fix is "
           "one version on every node, not the hardware")
_TRACES = ("the dumps show ranks that disagree on the collectives or never reached one: the "
           "program's order of collectives or a rank that stopped: fix or restart the job")
_TRANSPORT = ("NCCL chose sockets or a loopback/bridge interface: its settings or the container's "
              "RDMA libraries, not the hardware")
_UNRULED = ("no action was declared for it before issue 25: the one gpucheck gave an id no rule "
            "knew (a FAIL drains: an unexplained failure must not keep taking jobs; a WARN is run "
            "again)")
_CPU_RANKS = Cause("cpu_ranks", A.RERUN, "CPU ranks: a slow link or node is a busy or "
                   "throttled process, not a NIC or a GPU")


def _once(what: str) -> str:
    return (f"{what} in one short measurement: contention from other jobs, a cold start "
            "or the host's CPU can explain it, so confirm before acting; the hint says "
            "where to look when it repeats")


CHECKS: tuple[Check, ...] = (
    # run
    Check("all.{command}.failed", "how each command of gpucheck all ended (gpucheck all)",
          both(A.RERUN), "one command of `gpucheck all` stopped with an error, the others ran: "
          "run that command alone to see the whole error"),
    Check("all.{command}.{outcome}", "how each command of gpucheck all ended (gpucheck all)", {},
          INFO),
    Check("launch.cpu_ranks",
          "CPU ranks against the host's cores (every distributed command at launch)",
          both(A.FIX_CONFIG), "more CPU ranks than cores is a launch setting"),
    Check("ranks.numa", "each rank's CPU binding against its GPU's NUMA node (every distributed "
          "command at launch; numactl --show by hand)",
          both(A.FIX_CONFIG), _BINDING),
    Check("{command}.checkin", _ENDED("whether every rank started and reached the rendezvous"),
          both(A.FIX_CONFIG), "a rank never started or never reached the rendezvous: the launch "
          "(every node started, the same endpoint) is wrong, and running the same command again "
          "fails the same way"),
    Check("{command}.failed", _ENDED("whether the run finished, when no rank is to blame"),
          both(A.RERUN), "the run failed with no rank to blame: read the ranks' output, then run "
          "again"),
    Check("{command}.flight_recorder", "where the survivors' NCCL Flight Recorder dumps went "
          "after a failure, or why a rank wrote none (gpucheck hang --traces DIR reads them)",
          {}, "OK and SKIP only: where the dumps are, never a verdict",
          title="<command> Flight Recorder dumps",
          docs_anchor="docs/hang.md#command-flight-recorder"),
    Check("preflight.nvml", "the GPUs through NVML on each rank before the job starts (gpucheck "
          "preflight; gpucheck env on the node by hand)",
          {W: A.RERUN, F: A.DRAIN_NODE}, _UNRULED),
    Check("preflight.budget", "which checks finished within --budget (gpucheck preflight "
          "--budget S)", {W: A.RERUN, F: A.FIX_CONFIG},
          "a check left unfinished (a FAIL only under --strict) says the budget was short for "
          "this job, not that a node is bad: give a larger --budget"),
    Check("preflight.alloc", _PREFLIGHT("one large allocation and write on each rank's GPU"),
          {W: A.RERUN, F: A.DRAIN_NODE}, _UNRULED, title="Preflight allocation"),
    Check("preflight.links",
          _PREFLIGHT("each node's links to its neighbours before the job starts"),
          {W: A.RERUN, F: A.DRAIN_NODE}, "a link of this node failed the gate: the node must not "
          "take the job until someone has looked (the site passes drain-node)"),
    Check("preflight.node", _PREFLIGHT("every check of one node, the node named when it failed"),
          {W: A.RERUN, F: A.DRAIN_NODE}, "a node that failed the gate must not take the job until "
          "someone has looked (the site passes drain-node)"),
    Check("preflight.go", _PREFLIGHT("whether every rank passed the gate and the command starts"),
          {}, "OK only: the go; a no-go is preflight.no_go or the failing node's finding"),
    Check("preflight.node_all_reduce",
          _PREFLIGHT("each node's intra-node all_reduce bus bandwidth against the others', a slow "
                     "one measured again beside a known-good node"),
          {W: A.RERUN, F: A.DRAIN_NODE}, "slow twice, the second time beside a known-good node, "
          "on GPU ranks: the node's links or GPUs are the suspect and it must not take the job "
          "(FAIL); slow once, or on CPU ranks, names nothing (WARN, rerun); the site passes these "
          "actions",
          on_look=SLOW_TWICE, title="Preflight node all_reduce",
          causes=(Cause("cpu_ranks", A.RERUN, "CPU ranks: a slow node is the machine's load, not "
                        "its links"),)),
    Check("preflight.no_go", _PREFLIGHT("the gate failed without naming a node"), both(A.RERUN),
          "nothing points at a node (ranks alike wrong, an agreement that failed): there is no "
          "node to drain; read the findings, then run again",
          title="Preflight no-go"),
    Check("{command}.interrupted",
          _ENDED("whether the run was stopped before its end (Ctrl-C, a time limit)"),
          both(A.RERUN), "the run was stopped (Ctrl-C, a time limit): nothing was judged wrong, "
          "the rest was not measured"),
    Check("{command}.probe",
          _ENDED("whether a probe ran to its end (a crash or a hang of gpucheck's own code)"),
          both(A.RERUN), "a probe crashed or hung: gpucheck's own trouble, not a verdict on the "
          "machine; run again and report a bug if it repeats"),
    Check("{command}.rank_failed", _ENDED("whether every rank ran to its end"), both(A.RERUN),
          "a rank exited early, often because another one stopped answering; the hardware "
          "findings (faults, XIDs) carry their own actions"),
    Check("{command}.shared_gpu", "whether two ranks picked one GPU (every distributed command at "
          "launch; CUDA_VISIBLE_DEVICES and the launcher's GPU binding by hand)",
          both(A.FIX_CONFIG), "two ranks picked one GPU (the launch's GPU binding or "
          "CUDA_VISIBLE_DEVICES overlaps): the launch is wrong, not the GPU"),
    Check("{command}.rank_unresponsive", _ENDED("whether every rank kept answering"), both(A.RERUN),
          "a rank stopped answering and was killed; the fault watcher and kernel log say whether "
          "its GPU hung"),
    # bench
    Check("bench.consistency", _BENCH("the logits every rank computed for the same input"),
          {W: A.RERUN, F: A.DRAIN_NODE}, "WARN: ranks disagree and nothing names the odd one: "
          "more GPUs decide; FAIL: a rank computed wrong logits: a GPU that gives wrong answers "
          "must not take jobs until diagnosed (dcgmi diag)",
          causes=(Cause("all_alike", A.FIX_CONFIG, "every rank is wrong alike: the software stack "
                        "or the tolerance, not a GPU"),)),
    Check("bench.cpu_relayout", _BENCH("how CPU ranks were laid out"), {}, INFO),
    Check("bench.cpu_rotation", _BENCH("how CPU ranks were laid out"), {}, INFO),
    Check("bench.images.share", _BENCH("the input images read by each rank"), {}, INFO),
    Check("bench.images.skipped", _BENCH("the input images read by each rank"), both(A.FIX_CONFIG),
          "an unreadable input image: fix or remove the file"),
    Check("bench.node.slow", _BENCH("each node's throughput against the others'"), both(A.RERUN),
          _once("a slow node")),
    Check("bench.rank.straggler", _BENCH("each rank's pace against the others'"), both(A.RERUN),
          _once("a slow rank"),
          on_look=NEVER_DRAIN,
          causes=(Cause("host_stall", A.FIX_CONFIG, "the rank computed at speed and held the job "
                        "back because its host did not run it (a CPU quota, a competing or "
                        "stopped process, a data loader): the host's settings or load, not the "
                        "hardware"),)),
    # comm
    Check("comm.internode.shared_node", _INTERNODE, both(A.RERUN), "several slow node pairs share "
          "one node: a suspect, still from one short measurement: contention from other jobs, a "
          "cold start or the host's CPU can explain it, so confirm before acting; the hint says "
          "where to look when it repeats",
          on_look=SLOW_TWICE,
          causes=(_CPU_RANKS,)),
    Check("comm.internode.slow_pair", _INTERNODE, both(A.RERUN), _once("a slow node-to-node link"),
          on_look=SLOW_TWICE,
          causes=(_CPU_RANKS,)),
    Check("comm.internode.slow_rail", _INTERNODE, both(A.RERUN), _once("one slow NIC-to-NIC link"),
          on_look=SLOW_TWICE,
          causes=(_CPU_RANKS,)),
    Check("comm.nodes.slow_node", _COMM("each node's collective bandwidth against the others'"),
          both(A.RERUN), _once("a slow node"), on_look=SLOW_TWICE,
          causes=(_CPU_RANKS,)),
    Check("comm.rank_record", "whether rank 0 could read back every rank's records (gpucheck "
          "comm; gpucheck.records)",
          both(A.FIX_CONFIG), _RECORD),
    Check("comm.pairwise.slow_pair", _COMM("send/recv bandwidth of every GPU pair"), both(A.RERUN),
          _once("a slow GPU pair"),
          on_look=SLOW_TWICE,
          causes=(Cause("cpu_ranks", A.RERUN, "CPU ranks: a confirmed slow pair is a busy or "
                        "throttled process, not a link", W),)),
    Check("comm.transport.bad_interface", _COMM("the transport and interface NCCL chose"),
          both(A.FIX_CONFIG), _TRANSPORT),
    Check("comm.transport.sockets_with_ib", _COMM("the transport and interface NCCL chose"),
          both(A.FIX_CONFIG), _TRANSPORT),
    Check("comm.{op}.busbw_baseline",
          _COMM("a collective's bus bandwidth against the given baseline"),
          both(A.RERUN), "job-wide bandwidth below the given baseline names no node to drain and "
          "shares the fabric with other jobs; comm.pairwise.slow_pair, comm.nodes.slow_node and "
          "the faults section localise it, with their own actions"),
    Check("comm.{op}.correct", _COMM("the sums a collective returned"), both(A.DRAIN_NODE),
          "a collective gave wrong sums: silent data corruption on a GPU or link"),
    # stress
    Check("stress.copies", _STRESS("host-device copies"), {}, INFO),
    Check("stress.copies.link",
          _STRESS("host-device copies of each GPU alone against its link's rate"),
          both(A.DRAIN_NODE), "host copies alone far below the link's rate: link, slot or riser "
          "trouble to look into (NUMA placement has stress.numa)",
          on_look=SLOW_TWICE),
    Check("stress.copies.together", _STRESS("host-device copies of every GPU at once"),
          both(A.RERUN), "host copies of every GPU at once contend for shared PCIe switch uplinks "
          "and the CPU's root ports, by design unequal on PCIe boxes: slow there names no part, "
          "so never a drain on its own; stress.copies.link judges each GPU's link alone",
          on_look=NEVER_DRAIN),
    Check("stress.gemm.expected",
          _STRESS("sustained GEMM throughput against the model's typical figure"),
          both(A.FIX_CONFIG), _BELOW_EXPECTED, on_look=BELOW_EXPECTED),
    Check("stress.gemm.peers",
          _STRESS("sustained GEMM throughput of each GPU against its node's peers"),
          both(A.DRAIN_NODE), _PEERS, on_look=SLOW_TWICE),
    Check("stress.membw.expected",
          _STRESS("sustained memory bandwidth against the model's typical figure"),
          both(A.FIX_CONFIG), _BELOW_EXPECTED, on_look=BELOW_EXPECTED),
    Check("stress.membw.peers",
          _STRESS("sustained memory bandwidth of each GPU against its node's peers"),
          both(A.DRAIN_NODE), _PEERS, on_look=SLOW_TWICE),
    Check("stress.numa", _STRESS("each rank's CPU binding under stress"), both(A.FIX_CONFIG),
          _BINDING),
    Check("stress.rank_record", "whether rank 0 could read back every rank's records (gpucheck "
          "stress; gpucheck.records)",
          both(A.FIX_CONFIG), _RECORD),
    Check("stress.p2p", _STRESS("GPU-to-GPU copy bandwidth of each pair against its path class"),
          both(A.DRAIN_NODE), "one GPU pair copies far slower than the pairs of its own path "
          "class (NV#, PXB, SYS...): an NVLink or PCIe path to look into",
          on_look=SLOW_TWICE,
          causes=(Cause("no_peer_access", A.FIX_CONFIG, "peer access blocked for some pairs under "
                        "one CPU socket: ACS or IOMMU settings (pairs across sockets are refused "
                        "by design and are no WARN)"),)),
    Check("stress.power.limit", _STRESS("the enforced power limit against the default"),
          both(A.FIX_CONFIG), "the enforced power limit is below the default: a setting "
          "(nvidia-smi -pl, site policy), not a fault"),
    Check("stress.power.reach",
          _STRESS("the power each GPU draws under GEMM against its own limit"),
          both(A.RERUN), "below DCGM's targeted-power ratio of its own limit while its peers "
          "reach theirs, in one short GEMM window: confirm (gpucheck stress again, dcgmi diag -r "
          "targeted_power) before condemning; its slowdown, if any, has the drain-node peer "
          "findings"),
    Check("stress.sdc.agreement", _STRESS("the same product computed on every GPU"),
          {W: A.RERUN, F: A.DRAIN_NODE}, "WARN: ranks differ within tolerance and no majority "
          "names one: more GPUs or a longer run decides; FAIL: one GPU computed a wrong product: "
          "silent data corruption",
          causes=(Cause("all_alike", A.FIX_CONFIG, "every rank is wrong alike: the software "
                        "stack, not a GPU"),)),
    Check("stress.sdc.repeat", _STRESS("the same product computed again on one GPU"),
          both(A.DRAIN_NODE), "the same product gave different results: silent data corruption"),
    Check("stress.sdc.software_split",
          _STRESS("which ranks agree on the product, by node and software"),
          both(A.FIX_CONFIG), "ranks agree among themselves (or fill whole nodes) against the "
          "rest: independent GPU faults never give the same wrong bits, so the software or its "
          "settings differ; the CPU reference says which side is right"),
    Check("stress.sdc.straggler",
          _STRESS("each GPU's time for the SDC products against its peers'"),
          both(A.DRAIN_NODE), _PEERS, on_look=SLOW_TWICE),
    # hang
    Check("hang.discovery", _JOBS, {}, INFO),
    Check("hang.jobs", _JOBS, {}, INFO),
    Check("hang.rank.d_state", _HANG("a rank's process state (uninterruptible sleep)"),
          both(A.DRAIN_NODE), "a process in uninterruptible sleep for the whole window waits on a "
          "driver or file-system call that does not return: the node needs a look (dmesg), and "
          "the next job would hang the same way"),
    Check("hang.rank.unreadable", _HANG("whether a waited-for rank's stack can be read"),
          both(A.FIX_CONFIG), "the others wait for a rank whose stack could not be read: grant "
          "the ptrace capability and look again"),
    Check("hang.rank.{state}", _HANG("the rank the others wait for, and what it is doing"),
          both(A.RESTART_APP), "the job cannot go on without this rank (dead, stopped, in its own "
          "code or another collective): restart the job once its log or stack says why; the GPU "
          "is not blamed, the fault findings would"),
    Check("hang.stack", _JOBS, {}, INFO),
    Check("hang.traces.agree", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.armed", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.desync", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.missing", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.no_dump", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.split", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.traces.{kind}", _DUMPS, both(A.RESTART_APP), _TRACES),
    Check("hang.verdict", _HANG("whether a job on this node is stuck"), both(A.RERUN),
          "stuck, but no rank of this node to blame: look at every node at once (or read the "
          "Flight Recorder dumps) to find it"),
    # fleet
    Check("baseline.boot_id", _METRICS, {}, INFO),
    Check("baseline.kernel_log", _METRICS, {}, INFO),
    Check("baseline.metric", _METRICS, {W: A.RERUN}, SITE),
    Check("compare.environment", _SETTINGS, {W: A.FIX_CONFIG}, _CHANGED),
    Check("compare.facts", _SETTINGS, {}, INFO),
    Check("compare.findings", _COMPARE("WARN and FAIL findings of B that A did not have"),
          {W: A.RERUN, F: A.DRAIN_NODE}, _FALLBACK, relays=True),
    Check("compare.hardware", _COMPARE("GPU models and counts of A and B"), {F: A.DRAIN_NODE},
          SITE),
    Check("compare.host_bound", _COMPARE("whether a figure is bound by the host"), {W: A.RERUN},
          SITE),
    Check("compare.metrics", _SETTINGS, {}, INFO),
    Check("compare.missing", _COMPARE("metrics of A absent from B"), {W: A.RERUN}, SITE),
    Check("compare.noise", _COMPARE("how much A's and B's figures varied inside their runs"), {},
          INFO),
    Check("compare.regression", _COMPARE("B's metrics against A's beyond their noise"),
          {F: A.RERUN}, SITE),
    Check("compare.setup", _COMPARE("the run options of A and B"), {W: A.FIX_CONFIG}, SITE),
    Check("compare.versions", _SETTINGS, {W: A.FIX_CONFIG}, _CHANGED),
    Check("fleet.baseline", _FLEET("each node's metrics against the fleet baseline"), {W: A.RERUN},
          SITE),
    Check("fleet.coverage", _FLEET("the reports of a fleet directory"), {}, INFO),
    Check("fleet.drift", _FLEET("versions and settings of each node against the others"),
          {W: A.FIX_CONFIG, F: A.DRAIN_NODE}, SITE, relays=True),
    Check("fleet.duplicate_host", _FLEET("several reports of one host"),
          {W: A.FIX_CONFIG, F: A.RERUN}, SITE),
    Check("fleet.future_report", _FLEET("report times against now"), {W: A.FIX_CONFIG}, SITE),
    Check("fleet.inputs", _FLEET("the reports of a fleet directory"), {}, INFO),
    Check("fleet.missing", _FLEET("the expected nodes against the reports found"), {F: A.RERUN},
          SITE),
    Check("fleet.node", _FLEET("each node's own findings"), {W: A.RERUN, F: A.DRAIN_NODE},
          _FALLBACK, relays=True),
    Check("fleet.outlier", _FLEET("each node's metrics against the fleet's"), {W: A.RERUN}, SITE),
    Check("fleet.save_baseline", _FLEET("whether the fleet baseline could be written"),
          {F: A.FIX_CONFIG}, SITE),
    Check("fleet.unexpected", _FLEET("reports from nodes not expected"), {W: A.FIX_CONFIG}, SITE),
    Check("fleet.unreadable", _FLEET("every report file of the directory"), {W: A.RERUN}, SITE),
)
