"""How each GPU is judged: a `GpuRecord`'s `nvidia-smi -q` facts -> findings, one pure
function per check id; docs/env.md gives each rule and its source."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.devices import ExpectedGpus
from gpucheck.numa import cpulist
from gpucheck.probes.fabric import decode_health
from gpucheck.probes.gpu_read import BAD_CLOCK_REASONS, DriverInfo, GpuRecord
from gpucheck.probes.nvml import SLOW_ADVICE, Nvml, slow_words
from gpucheck.probes.xid_table import RECOVERY_BY_NAME
from gpucheck.report import Finding, fail, ok, skip, warn
from gpucheck.subject import text

# The NVML failures driver.nvml acts on (gpucheck/checks/node.py).
_DRIVER_CAUSES = ("gpu_lost", "needs_reset", "timed_out", "no_answer")


def driver_finding(info: DriverInfo, pci_gpus: int) -> Finding:
    if info.present:
        return ok("driver.nvml", f"NVIDIA driver {info.driver_version} (CUDA "
                  f"{info.cuda_version or 'n/a'}), {info.gpu_count} GPU(s)")
    failure = info.failure
    assert failure is not None
    if failure.kind == "ImportError":
        return warn("driver.nvml", f"cannot query the driver: {failure.detail}",
                    "pip install nvidia-ml-py")
    if failure.kind == "NVMLError_LibraryNotFound" and pci_gpus == 0:
        return skip("driver.nvml", "no NVIDIA driver and no NVIDIA GPU on this machine")
    message = failure.meaning
    if pci_gpus:
        message += f" ({pci_gpus} NVIDIA GPU(s) on the PCI bus)"
    cause = failure.cause if failure.cause in _DRIVER_CAUSES else None
    return fail("driver.nvml", message, failure.hint, cause=cause)


def busy_finding(gpu: GpuRecord) -> Finding:
    """WARN before a benchmark: another process is on the GPU."""
    if gpu.process_count is None:
        return skip("gpu.busy", "process list: n/a", gpu.subject)
    if gpu.process_count:
        pids = ", ".join(str(p["pid"]) for p in gpu.processes[:8])
        return warn("gpu.busy", f"{gpu.process_count} process(es) using it (pid {pids}), "
                    f"utilisation {gpu.utilization_gpu_pct}%",
                    "wait for them or pick another GPU before benchmarking "
                    "(nvidia-smi --query-compute-apps=pid,process_name --format=csv)",
                    gpu.subject)
    return ok("gpu.busy", "no processes on it", gpu.subject)


def pcie_finding(gpu: GpuRecord) -> Finding:
    """Link width below its max is a seating/riser/slot problem; a lower gen is often idle."""
    cur, top = gpu.pcie_width_current, gpu.pcie_width_max
    if cur is None or top is None:
        return skip("gpu.pcie.width", "PCIe link width: n/a", gpu.subject)
    gen = f"Gen{gpu.pcie_gen_current}/{gpu.pcie_gen_max}"
    if cur < top:
        return warn("gpu.pcie.width", f"PCIe link is x{cur} of x{top} ({gen})",
                    "reseat the GPU or check the riser/slot; a narrower link cuts host "
                    "transfer bandwidth", gpu.subject)
    note = ""
    if gpu.pcie_gen_current and gpu.pcie_gen_max and gpu.pcie_gen_current < gpu.pcie_gen_max:
        note = " (idle GPUs lower the link generation to save power; check under load)"
    return ok("gpu.pcie.width", f"PCIe link x{cur} of x{top}, {gen}{note}", gpu.subject)


def ecc_findings(gpu: GpuRecord) -> list[Finding]:
    subject = gpu.subject
    volatile, aggregate = gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected
    if volatile is None:
        mode = "ECC disabled" if gpu.ecc_mode is False else "ECC counters n/a"
        return [skip("gpu.ecc.volatile_uncorrected", mode, subject)]
    findings = []
    if volatile > 0:
        findings.append(fail("gpu.ecc.volatile_uncorrected",
                             f"{volatile} uncorrected ECC error(s) since the last driver load",
                             "drain the node and reset the GPU (nvidia-smi -r); if they return, "
                             "replace it", subject))
    else:
        findings.append(ok("gpu.ecc.volatile_uncorrected", "no uncorrected ECC errors",
                           subject))
    if aggregate:
        findings.append(warn("gpu.ecc.aggregate_uncorrected",
                             f"{aggregate} uncorrected ECC error(s) over the GPU's lifetime",
                             "watch this GPU; repeated errors mean an RMA", subject))
    return findings


def retirement_findings(gpu: GpuRecord) -> list[Finding]:
    subject, findings = gpu.subject, []
    if gpu.retired_pages_pending:
        findings.append(fail("gpu.retired_pages.pending", "retired memory pages are pending",
                             "reset the GPU (nvidia-smi -r) or reboot to retire them", subject))
    if gpu.remapped_rows_pending:
        findings.append(fail("gpu.remapped_rows.pending", "a memory row remap is pending",
                             "reset the GPU (nvidia-smi -r) or reboot so the remap takes "
                             "effect", subject))
    if gpu.remapped_rows_failed:
        findings.append(fail("gpu.remapped_rows.failed", "a memory row remap failed",
                             "the GPU needs service: drain the node and open an RMA", subject))
    if gpu.bank_remap_pending:
        findings.append(fail("gpu.bank_remap.pending", f"a memory bank remap is pending "
                             f"({_banks(gpu)})", "reset the GPU (nvidia-smi -r) or reboot so "
                             "the remap takes effect", subject))
    known = (gpu.retired_pages_pending, gpu.remapped_rows_pending, gpu.bank_remap_pending)
    if not findings and any(v is not None for v in known):
        banks = f"; {_banks(gpu)}" if gpu.bank_remap_pending is not None else ""
        findings.append(ok("gpu.memory_retirement", "no pending page retirement, row or bank "
                           f"remap{banks}", subject))
    return findings


def _banks(gpu: GpuRecord) -> str:
    """"bank remappings: 2 active, 0 inactive" (`nvidia-smi -q -d ROW_REMAPPER`)."""
    active, inactive = ("n/a" if v is None else v
                        for v in (gpu.bank_remaps_active, gpu.bank_remaps_inactive))
    return f"bank remappings: {active} active, {inactive} inactive"


def clock_finding(gpu: GpuRecord) -> Finding:
    """`nvidia-smi -q -d PERFORMANCE`: a slowdown held through the second look is a WARN;
    one seen in one sample only is not judged, a brief one is noted in the OK."""
    reasons, check = gpu.clock_event_reasons, "gpu.clocks.event_reasons"
    if reasons is None:
        return skip(check, "clock event reasons: n/a", gpu.subject)
    bad = [r for r in reasons if r in BAD_CLOCK_REASONS]
    look = gpu.clock_window
    if look is None and bad and bad != ["hw_slowdown"]:
        return skip(check, f"{', '.join(bad)} in one sample, and no second look (NVML did not "
                    "answer it): one sample cannot tell a held slowdown from a moment at "
                    "the limit", gpu.subject)
    if look is not None and look["held"]:
        return warn(check, f"clocks held down by {', '.join(look['held'])} "
                    f"({_look_words(look, look['held'])}; SM {gpu.sm_clock_mhz}/"
                    f"{gpu.sm_clock_max_mhz} MHz, {gpu.temperature_c} C)",
                    "check cooling, airflow and the power supply; nvidia-smi -q -d "
                    "PERFORMANCE,TEMPERATURE", gpu.subject)
    if look is not None:
        brief = [r for r in BAD_CLOCK_REASONS if r in look["fractions"] or r in bad]
        return ok(check, f"no held slowdown: briefly {', '.join(brief)} "
                  f"({_look_words(look, brief)}: not held)", gpu.subject)
    # One sample cannot hold 0x8 against NVML's own caveat (also set at P-state and
    # clock changes): alone it is noted, not warned; docs/faults.md, gpucheck stress.
    note = ("; the HW slowdown flag alone, which NVML also sets at P-state and clock "
            "changes: one sample cannot tell") if bad else ""
    return ok(check, f"no slowdown ({', '.join(reasons) or 'none'}{note})", gpu.subject)


def _look_words(look: Mapping[str, Any], reasons: Sequence[str]) -> str:
    """"sw_thermal_slowdown in 20% of 21 samples, 12% of 1.0 s by the driver's counter"."""
    parts = []
    for reason in reasons:
        share = (look.get("counter_share") or {}).get(reason)
        counted = "" if share is None else f", {share * 100:.0f}% by the driver's counter"
        parts.append(f"{reason} in {look['fractions'].get(reason, 0.0) * 100:.0f}% of "
                     f"{look['samples']} samples{counted}")
    return "; ".join(parts) + f" over {look['window_s']} s"


def persistence_finding(gpu: GpuRecord) -> Finding:
    """Persistence mode off: every process that opens the GPU brings it up again."""
    check = "gpu.persistence_mode"
    if gpu.persistence_mode is None:
        return skip(check, "persistence mode: n/a", gpu.subject)
    if not gpu.persistence_mode:
        return warn(check, "persistence mode is off: the driver tears the GPU down whenever no "
                    "process holds it, so each job (and each NVML or CUDA start) brings it up "
                    "again, which takes seconds per GPU on H100/H200/B200 and can look like a "
                    "hang", "turn it on: sudo nvidia-smi -pm 1, or run the nvidia-persistenced "
                    "service (systemctl enable --now nvidia-persistenced)", gpu.subject)
    return ok(check, "persistence mode is on", gpu.subject)


def mig_finding(gpu: GpuRecord) -> Finding | None:
    """MIG on is a choice, not a fault: say what it means. A pending change is a WARN."""
    check = "gpu.mig_mode"
    if gpu.mig_mode_pending is not None and gpu.mig_mode is not None \
            and gpu.mig_mode_pending != gpu.mig_mode:
        now, then = ("on", "off") if gpu.mig_mode else ("off", "on")
        return warn(check, f"MIG mode is {now} but {then} is pending: the change takes effect "
                    "only after a GPU reset", f"reset the GPU (nvidia-smi -r -i {gpu.index}) "
                    "or reboot the node", gpu.subject)
    if not gpu.mig_mode:
        return None
    return ok(check, "MIG mode is on: CUDA gives each process one MIG instance (choose it with "
              "CUDA_VISIBLE_DEVICES=MIG-<uuid>), and NCCL cannot connect instances of the same "
              "GPU, so a multi-GPU job needs one instance per physical GPU", gpu.subject)


def _recovery_na_words(why: str | None) -> str:
    from gpucheck.probes.pyenv import package_version  # importlib.metadata: when asked

    if why == "nvidia-ml-py":
        return (f"recovery action: n/a (the installed nvidia-ml-py "
                f"{package_version('nvidia-ml-py') or ''} lacks "
                "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, so gpucheck cannot ask the driver: "
                "pip install -U nvidia-ml-py; releases for R565 and later have it)")
    return ("recovery action: n/a (the driver answers NotSupported for "
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: drivers before R565 do not report it; "
            "nvidia-ml-py has the field)")


def recovery_action_finding(gpu: GpuRecord) -> Finding:
    """The action NVML asks for: NONE is OK, a known one WARN/FAIL naming NVML's
    constant, an unknown one a WARN, none reported a SKIP."""
    check, action = "gpu.recovery_action", gpu.recovery_action
    if action is None:
        return skip(check, _recovery_na_words(gpu.recovery_action_na), gpu.subject)
    if action == "none":
        return ok(check, "NVML asks for no recovery action (NVML_GPU_RECOVERY_ACTION_NONE)",
                  gpu.subject)
    known = RECOVERY_BY_NAME.get(action)
    if known is None:
        return warn(check, f"NVML asks for a recovery action gpucheck does not know ({action})",
                    "look the value up in nvmlDeviceGpuRecoveryAction_t (NVML API reference) "
                    "and nvidia-smi -q; keep the node out of service until then", gpu.subject)
    name = f"NVML_GPU_RECOVERY_ACTION_{action.upper()}"
    make = fail if known.fails else warn
    return make(check, f"NVML asks for a recovery action: {name}: {known.meaning}",
                known.todo.format(index=gpu.index), gpu.subject,
                cause=action if action in ("gpu_reset", "bus_reset") else None)


def gpu_findings(gpu: GpuRecord) -> list[Finding]:
    if gpu.error:
        check = "gpu.lost" if gpu.error_kind == "NVMLError_GpuIsLost" else "gpu.query"
        denied = check == "gpu.query" and gpu.error_kind == "NVMLError_NoPermission"
        return [fail(check, f"query failed: {gpu.error}", gpu.error_hint or "run nvidia-smi",
                     gpu.subject, cause="no_permission" if denied else None)]
    optional = [f for f in (mig_finding(gpu), fabric_finding(gpu)) if f is not None]
    return [busy_finding(gpu), pcie_finding(gpu), *ecc_findings(gpu),
            *retirement_findings(gpu), clock_finding(gpu), persistence_finding(gpu),
            *optional, *fabric_health_findings(gpu), recovery_action_finding(gpu)]


def numa_findings(gpus: Sequence[GpuRecord], nodes: Mapping[int, str]) -> list[Finding]:
    """An OK per NUMA node naming its GPUs and CPUs (never a WARN: the board's design)."""
    if len(nodes) < 2:
        return []  # one node, or no NUMA information: nothing to say
    by_node: dict[int, list[int]] = {}
    for gpu in gpus:
        if gpu.numa_node is not None:
            by_node.setdefault(gpu.numa_node, []).append(gpu.index)
    return [ok("gpu.numa", f"GPU {cpulist(tuple(indices))} on NUMA node {node}"
               + (f" (CPUs {nodes[node]})" if nodes.get(node) else ""), text(f"NUMA node {node}"))
            for node, indices in sorted(by_node.items())]



def hang_finding(nvml: Nvml) -> Finding | None:
    """A hung NVML call (both budgets missed) FAILs; a late one is a WARN."""
    if nvml.hung is not None:
        return fail("driver.nvml_hang", str(nvml.hung), "check dmesg for Xid errors; the "
                    "driver may need a reset or the node a reboot")
    if nvml.slow_calls:
        return warn("driver.nvml_slow", slow_words(nvml.slow_calls), SLOW_ADVICE)
    return None


def count_finding(seen: int | None, expected: ExpectedGpus, most_seen: int | None = None
                  ) -> Finding:
    """The GPUs NVML sees (None: not read) against those expected and the most an earlier
    health check saw here: fewer is a FAIL whoever says so."""
    have = seen or 0
    said = f"{expected.count} expected ({expected.source})"
    if have < expected.count:
        return fail("gpu.count", f"NVML sees {have if seen is not None else 'no'} GPU(s), "
                    f"{said}", "a GPU fell off the bus, or the driver did not load or "
                    "initialise it: check nvidia-smi, lspci -d 10de: and dmesg for Xid 79; "
                    "reboot or have it reseated (if it has fewer on purpose, say so: "
                    "--expect-gpus N, or GPUCHECK_EXPECT_GPUS=N)")
    if most_seen is not None and have < most_seen and not expected.stated:
        return fail("gpu.count", f"NVML sees {have} GPU(s), {most_seen} at an earlier check "
                    f"({said})", "a GPU fell off the bus or did not initialise: check dmesg "
                    "for Xid 79 and nvidia-smi; if it was removed on purpose, pass "
                    f"--expect-gpus {have} or delete the state dir's health-state.json")
    if have > expected.count and expected.stated:
        return warn("gpu.count", f"NVML sees {have} GPU(s), more than the {expected.count} "
                    "expected", "correct --expect-gpus for this node")
    return ok("gpu.count", f"{have} GPU(s), {said}")


def cpu_ranks_finding(expected: ExpectedGpus, asked: bool = False) -> Finding | None:
    """`gpu.count` for CPU ranks where GPUs are expected: FAIL when they fell back to CPU,
    a SKIP when --device cpu asked for them; None where no GPU is expected."""
    if not expected.count:
        return None
    if asked:
        return skip("gpu.count", f"CPU ranks, as --device cpu asked: the {expected.count} "
                    f"GPU(s) expected ({expected.source}) were not checked")
    return fail("gpu.count", f"the ranks ran on CPU: no GPU was usable, {expected.count} "
                f"expected ({expected.source})", "run gpucheck env on this node to see why "
                "(driver, nvidia-smi, CUDA_VISIBLE_DEVICES); a GPU node never passes on CPU "
                "ranks")


FABRIC_HINT = ("start the fabric manager: systemctl start nvidia-fabricmanager (and "
               "systemctl enable it; its version must match the driver's); see journalctl -u "
               "nvidia-fabricmanager, and nvidia-smi -q | grep -A3 Fabric")


def fabric_finding(gpu: GpuRecord) -> Finding | None:
    """NVSwitch systems: CUDA will not start (error 802) until the fabric registers the GPU."""
    check, state = "gpu.fabric", gpu.fabric_state
    if state in (None, "not_supported"):
        return None  # no NVSwitch fabric on this GPU (PCIe cards, pre-Hopper)
    if state != "completed":
        wait = " (it can take a minute after boot: run again)" if state == "in_progress" else ""
        where = {"not_started": "has not started", "in_progress": "is still in progress"}
        return fail(check, f"NVSwitch fabric registration {where.get(state, f'is {state}')}: CUDA "
                    "fails to initialise on this GPU (error 802, \"system not yet "
                    f"initialized\") until the fabric manager has registered it{wait}",
                    FABRIC_HINT, gpu.subject,
                    cause="registering" if state == "in_progress" else None)
    if gpu.fabric_status != "success":
        return fail(check, f"NVSwitch fabric registration failed ({gpu.fabric_status}): CUDA "
                    "fails to initialise on this GPU (error 802)", FABRIC_HINT, gpu.subject)
    return ok(check, "NVSwitch fabric registration completed", gpu.subject)


_FABRIC_LOOK = ("nvidia-smi -q | grep -A12 Fabric; nvidia-smi nvlink -s; the fabric "
                "manager's log: journalctl -u nvidia-fabricmanager")


def _fabric_problems(health: Mapping[str, str], gpu: GpuRecord) -> list[Finding]:
    s, found = gpu.subject, []
    if health.get("degraded_bandwidth") == "true":
        found.append(warn("gpu.fabric.degraded_bandwidth", "NVSwitch fabric bandwidth is "
                          "degraded (NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE): collectives "
                          "over NVLink run slower", f"have the NVLink/NVSwitch checked: "
                          f"{_FABRIC_LOOK}", s))
    if health.get("route_unhealthy") == "true":
        found.append(fail("gpu.fabric.route_unhealthy", "an NVSwitch fabric route of this "
                          "GPU is unhealthy (NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE): "
                          "NVLink traffic to some peers can fail", f"drain the node; "
                          f"{_FABRIC_LOOK}", s))
    busy = [k for k in ("route_recovery", "access_timeout_recovery")
            if health.get(k) == "in_progress"]
    if busy:
        found.append(warn("gpu.fabric.recovering", f"the fabric is recovering "
                          f"({', '.join(busy)} in progress): NVLink traffic may stall until "
                          "it ends", f"run gpucheck env again in a minute; {_FABRIC_LOOK}", s))
    config = health.get("incorrect_configuration", "none")
    if config != "none" and not config.startswith("unknown"):
        found.append(fail("gpu.fabric.configuration", "the fabric reports an incorrect "
                          f"configuration: NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_"
                          f"{config}", f"fix the configuration it names; {_FABRIC_LOOK}", s,
                          cause="insufficient_nvlinks"
                          if config.upper() == "INSUFFICIENT_NVLINKS" else None))
    return found


def fabric_health_findings(gpu: GpuRecord) -> list[Finding]:
    """The fabric's health once registered; the summary only where no field explains it."""
    if gpu.fabric_state != "completed" or gpu.fabric_status != "success":
        return []
    health, summary = decode_health(gpu.fabric_health_mask), gpu.fabric_health_summary
    if not health and summary is None:
        return [skip("gpu.fabric.health", "fabric health: n/a (this driver reports no "
                     "health mask: drivers before R550)", gpu.subject)]
    found = _fabric_problems(health, gpu)
    shown = ", ".join(f"{k}={v}" for k, v in health.items())
    if not found and summary == "unhealthy":
        found.append(fail("gpu.fabric.health", f"NVML calls the fabric unhealthy "
                          f"(NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY; {shown})",
                          f"drain the node; {_FABRIC_LOOK}", gpu.subject))
    elif not found and summary == "limited_capacity":
        found.append(warn("gpu.fabric.health", f"NVML says the fabric runs at limited capacity "
                          f"(NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY; {shown})",
                          f"have the NVLink/NVSwitch checked: {_FABRIC_LOOK}", gpu.subject))
    return found or [ok("gpu.fabric.health", f"NVSwitch fabric healthy (summary "
                        f"{summary or 'n/a'}; {shown or 'no health fields'})", gpu.subject)]
