"""A hardware fault during preflight's checks (the fault watch every rank runs, against
the fake pynvml of tests/fake_nvml_site): an XID 79 on rank 1's GPU is a no-go naming
rank 1, its node and its GPU; healthy fake GPUs are a go."""

from __future__ import annotations

import json
from pathlib import Path

from plant import planted
from test_faults_wiring_runs import (  # noqa: F401 (fake_gpus: a fixture)
    LABEL,
    WATCH_FAKE,
    XID,
    fake_gpus,
)

from gpucheck.cli import main


def _run(tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    # The fault is delivered at the watch's first poll, however short the run: a budget
    # that fits the allocation only (the other checks skipped) is enough.
    with planted(WATCH_FAKE):  # the ranks watch the fake GPUs' bus ids
        code = main(["preflight", "--n-gpus", "2", "--budget", "1.5", "-q", "-o", str(out)])
    return code, json.loads(out.read_text())


def test_an_xid_79_during_the_checks_is_a_no_go_naming_rank_one(tmp_path: Path,
                                                                fake_gpus) -> None:  # noqa: F811
    fake_gpus(events=[{"gpu": 1, "type": XID, "data": 79, "on_poll": 1}])
    code, report = _run(tmp_path)
    assert code == 1
    head = report["sections"][0]["data"]
    assert head["go"] is False
    [node] = head["failing_nodes"]
    assert node["ranks"] == [1] and node["checks"] == ["preflight.faults"]
    assert LABEL[1] in node["why"][0]


def test_healthy_watched_gpus_are_a_go(tmp_path: Path, fake_gpus) -> None:  # noqa: F811
    fake_gpus()
    code, report = _run(tmp_path)
    assert code == 0, [f for s in report["sections"] for f in s["findings"]
                       if f["status"] in ("WARN", "FAIL")]
    faults = next(s for s in report["sections"] if s["name"] == "faults")
    assert {f["status"] for f in faults["findings"]} == {"OK"}
