"""Property test (hypothesis): no state file makes `gpucheck health` raise. Random JSON
as the whole file, a good state with one part replaced by any JSON value, and raw bytes:
each run gives a report, at most one `health.state` finding, the same on the next run."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck.health.state import STATE_FILE
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.health_fakes import add_port, reboot, run_health, write_log, xid_line

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TEXT = st.text(alphabet=st.sampled_from(["a", "|", "\n", "\x1b", "é", "\ud800", "0", "-"]),
               max_size=6)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
GOOD: dict[str, Any] = {
    "version": 2, "gpus": {"most_seen": 1},
    "faults": [{"key": "kernel_log.xid|GPU 0|48", "check": "kernel_log.xid", "status": "FAIL",
                "action": "reset-gpu", "subject": "GPU 0", "message": "XID 48", "hint": None,
                "boot_id": "boot-1", "since": "2026-11-26T10:00:00+00:00"}],
    "baseline": {},
    "consumers": {"default": {"boot_id": "boot-1",
                              "kernel_log": {"count": 1, "chain": "ab", "tail": ["ab"],
                                             "source": "dmesg"},
                              "ib_ports": {"mlx5_0/1": {"seen_active": True,
                                                        "counters": {"link_downed": 1},
                                                        "at": "x"}},
                              "last": {"verdict": "FAIL", "at": "x", "problems": ["a|b"]}}}}
PATHS = [("version",), ("gpus",), ("gpus", "most_seen"), ("faults",), ("faults", 0),
         ("faults", 0, "status"), ("faults", 0, "action"), ("baseline",), ("consumers",),
         ("consumers", "default"), ("consumers", "default", "kernel_log"),
         ("consumers", "default", "kernel_log", "tail"),
         ("consumers", "default", "kernel_log", "count"),
         ("consumers", "default", "ib_ports"), ("consumers", "default", "ib_ports", "mlx5_0/1"),
         ("consumers", "default", "last"), ("consumers", "default", "last", "problems")]


def _replaced(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    state = json.loads(json.dumps(GOOD))
    where = state
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return state


def _file(data: Any) -> bytes:
    return json.dumps(data).encode("utf-8", "surrogatepass")


CONTENTS = st.one_of(JSON.map(_file), st.binary(max_size=64),
                     st.tuples(st.sampled_from(PATHS), JSON).map(
                         lambda p: _file(_replaced(*p))))


@FUZZ
@given(content=CONTENTS)
def test_no_state_file_makes_health_raise(content):
    fake = FakeNvml([FakeGpu()])
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(sys.modules,
                                                               {"pynvml": fake.module}):
        root = Path(tmp)
        add_port(root / "sys", "mlx5_0")
        reboot(root, "boot-1")
        write_log(root / "dmesg.txt", [xid_line(1.0, "0000:18:00", 48, "DBE")])
        (root / "state").mkdir()
        (root / "state" / STATE_FILE).write_bytes(content)
        report = run_health(root)
        unread = [f for f in report.findings if f.check == "health.state"]
        assert len(unread) <= 1
        again = run_health(root)  # one that could not be read holds until cleared
        assert len([f for f in again.findings if f.check == "health.state"]) == len(unread)
