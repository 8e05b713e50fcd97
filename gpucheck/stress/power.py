"""Power reach under load (DCGM's targeted power, on stress's own GEMM): each rank's
board power sampled during the GEMM phase, and the verdicts `stress.power.reach` and
`stress.power.limit` (docs/stress.md has the thresholds and why)."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucheck import subject as subjects
from gpucheck.distributed.nodes import group_by_node
from gpucheck.probes.nvml import Nvml, NvmlFailure
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stress.records import PowerReading

SAMPLE_S = 0.1
REACH_FRACTION = 0.75  # DCGM targeted_power's target_power_min_ratio
LIMIT_SLACK = 0.98  # limits are set in whole watts; below 98 % of the default is a cap
CPU_REASON = "CPU ranks: no GPU power to read"


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(float(milliwatts) / 1000.0, 1)


class PowerSampler:
    """Sample one GPU's power draw on a thread while the load runs; never raises into
    the load (without a bus id or NVML, or a call failing, `why` says why)."""

    def __init__(self, rank: int, bus_id: str | None,
                 nvml_factory: Callable[[], Nvml] = Nvml, every_s: float = SAMPLE_S) -> None:
        self.rank, self.bus_id, self.every_s = rank, bus_id, every_s
        self._factory = nvml_factory
        self._nvml: Nvml | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_w: list[float] = []
        self.limit_w: float | None = None
        self.default_limit_w: float | None = None
        self.why: str | None = None if bus_id else CPU_REASON

    def __enter__(self) -> PowerSampler:
        if self.bus_id is None:
            return self
        self._nvml = self._factory()
        try:
            handle = self._nvml.call("nvmlDeviceGetHandleByPciBusId", self.bus_id)
            self.limit_w = _watts(self._nvml.get("nvmlDeviceGetEnforcedPowerLimit", handle))
            self.default_limit_w = _watts(
                self._nvml.get("nvmlDeviceGetPowerManagementDefaultLimit", handle))
        except NvmlFailure as exc:
            self.why = f"power not read ({exc})"
            return self
        self._thread = threading.Thread(target=self._run, args=(handle,), daemon=True,
                                        name="gpucheck-power")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.every_s + 60)
        if self._nvml is not None:
            self._nvml.shutdown()

    def _run(self, handle: Any) -> None:
        while not self._stop.is_set():
            try:
                draw = self._nvml.call("nvmlDeviceGetPowerUsage", handle) if self._nvml \
                    else None
            except NvmlFailure as exc:
                self.why = f"power draw not read ({exc})"
                return
            if draw is not None:
                self.samples_w.append(float(draw) / 1000.0)
            self._stop.wait(self.every_s)

    def result(self) -> PowerReading:
        samples = sorted(self.samples_w)
        p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))] if samples else None
        return PowerReading(rank=self.rank, samples=len(samples),
                            draw_p90_w=None if p90 is None else round(p90, 1),
                            draw_max_w=round(samples[-1], 1) if samples else None,
                            limit_w=self.limit_w, default_limit_w=self.default_limit_w,
                            why=self.why if not samples or self.why else None)


def reach(row: PowerReading) -> float | None:
    """Sustained draw / enforced limit, or None when either is unknown."""
    if row.draw_p90_w is None or not row.limit_w:
        return None
    return row.draw_p90_w / row.limit_w


def power_findings(rows: Sequence[PowerReading], ranks: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str]) -> list[Finding]:
    """`stress.power.reach` and `stress.power.limit` over every rank's readings."""
    read = [r for r in rows if reach(r) is not None]
    if not read:
        whys = sorted({r.why for r in rows if r.why}) or [CPU_REASON]
        return [skip("stress.power.reach", f"no power reading under load: {whys[0]}")]
    return _reach_findings(read, ranks, names) + _limit_findings(read, names)


def _reach_findings(rows: Sequence[PowerReading], ranks: Sequence[Mapping[str, Any]],
                    names: Mapping[int, str]) -> list[Finding]:
    """Per node and model: a GPU below REACH_FRACTION of its limit while the median of
    its peers reaches it; nothing to judge where the peers do not reach it either."""
    by_rank = {r.rank: r for r in rows}
    model = {int(r["rank"]): r.get("gpu_name") for r in ranks}
    findings, judged, short = [], 0, 0
    for members in group_by_node(ranks).values():
        for name in dict.fromkeys(model.get(m) for m in members):
            mine = [m for m in members if model.get(m) == name and m in by_rank]
            for m in mine:
                peers = [reach(by_rank[p]) or 0.0 for p in mine if p != m]
                if not peers:
                    continue
                judged += 1
                peer_reach, own = statistics.median(peers), reach(by_rank[m]) or 0.0
                if peer_reach < REACH_FRACTION:
                    short += 1
                elif own < REACH_FRACTION:
                    row = by_rank[m]
                    findings.append(warn(
                        "stress.power.reach", f"{names.get(m, f'rank {m}')} drew "
                        f"{row.draw_p90_w:g} W under the GEMM load, {own:.0%} of its "
                        f"{row.limit_w:g} W limit, while its peers reached {peer_reach:.0%} "
                        f"of theirs (at least {REACH_FRACTION:.0%} expected, as DCGM's "
                        "targeted power)",
                        hint="a GPU that cannot draw its power under full load is held back "
                        "by something else: run dcgmi diag -r targeted_power, check "
                        "nvidia-smi -q -d PERFORMANCE,POWER (slowdown reasons), its power "
                        "cables and the PSU", subject=subjects.rank(m)))
    if findings:
        return findings
    if not judged:
        return [ok("stress.power.reach", f"{len(rows)} GPU(s) read under load; no peer of the "
                   "same model on its node to compare with (median reach "
                   f"{statistics.median(reach(r) or 0.0 for r in rows):.0%} of the limit)")]
    words = (f"; {short} judged against peers that did not reach {REACH_FRACTION:.0%} "
             "either (the load did not bring them to their limit)") if short else ""
    return [ok("stress.power.reach", f"{judged} GPU(s) drew at least {REACH_FRACTION:.0%} of "
               f"their enforced power limit under the GEMM load, as their peers{words}")]


def _limit_findings(rows: Sequence[PowerReading],
                    names: Mapping[int, str]) -> list[Finding]:
    capped = [r for r in rows if r.default_limit_w and r.limit_w
              and r.limit_w < LIMIT_SLACK * r.default_limit_w]
    findings = [warn("stress.power.limit",
                     f"{names.get(r.rank, f'rank {r.rank}')}: power limit "
                     f"{r.limit_w:g} W, below its default {r.default_limit_w:g} W",
                     hint="someone capped this GPU's power (nvidia-smi -pl, a DCGM or site "
                     "policy): it runs slower than its peers by setting; restore it with "
                     "nvidia-smi -i N -pl <default> if the cap was not meant",
                     subject=subjects.rank(r.rank)) for r in capped]
    known = [r for r in rows if r.default_limit_w]
    if not findings and known:
        findings.append(ok("stress.power.limit", f"{len(known)} GPU(s) at their default "
                           "power limit"))
    if not known:
        findings.append(skip("stress.power.limit", "the default power limit was not "
                             "readable (nvmlDeviceGetPowerManagementDefaultLimit)"))
    return findings
