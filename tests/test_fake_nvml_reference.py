"""The fake pynvml answers as the NVML reference says: its docstring's table names every
NVML function gpucheck calls with its documented errors, and the fake raises only those.

A new NVML call in gpucheck/ fails here until its row is in tests/fake_pynvml.py's
table (with the errors the NVML API reference documents for it) and the fake has it.
"""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from gpucheck.report import Status
from tests import fake_pynvml
from tests.fake_pynvml import DOCUMENTED_ERRORS, NO_INIT, FakeGpu, FakeNvml
from tests.fake_pynvml import probe as _probe

REPO = Path(__file__).resolve().parents[1]
# A name in quotes ("nvmlDeviceGetName", the doorway's form) or after `pynvml.`.
_NAME = re.compile(r"""["'](nvml[A-Z]\w*)["']|pynvml\.(nvml[A-Z]\w*)""")


def _called_by_gpucheck() -> set[str]:
    """Every pynvml function named in gpucheck/ and benchmarks/ (constants and the
    nvmlEventType* masks are not functions and are left out)."""
    pynvml = pytest.importorskip("pynvml")
    names: set[str] = set()
    for folder in ("gpucheck", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for match in _NAME.finditer(path.read_text(encoding="utf-8")):
                names.add(match.group(1) or match.group(2))
    return {n for n in names if inspect.isfunction(getattr(pynvml, n, None))}


def test_every_nvml_function_gpucheck_calls_has_a_row_in_the_fakes_reference_table():
    called = _called_by_gpucheck()
    assert {"nvmlDeviceGetFieldValues", "nvmlInit", "nvmlEventSetWait_v2"} <= called
    missing = sorted(called - set(DOCUMENTED_ERRORS))
    assert not missing, f"add these to tests/fake_pynvml.py's table: {missing}"


def test_every_row_of_the_table_is_a_pynvml_function_the_fake_has():
    pynvml = pytest.importorskip("pynvml")
    module = FakeNvml([FakeGpu()]).module
    for name, errors in DOCUMENTED_ERRORS.items():
        assert inspect.isfunction(getattr(pynvml, name, None)), name
        assert callable(getattr(module, name, None)), name
        for error in errors - {NO_INIT, "(the two every row has)"}:
            assert hasattr(pynvml, f"NVMLError_{error}"), (name, error)


def _arguments(fake: FakeNvml, name: str, handle: Any) -> list[Any]:
    """Plausible arguments for `name`, by parameter name (pynvml's own names)."""
    event_set = fake.nvmlEventSetCreate() if fake.initialised else fake_pynvml._EventSet()
    by_name = {"handle": handle, "device": handle, "device1": handle, "device2": handle,
               "index": 0, "link": 0, "counter": 0, "type": 1, "sensor": 0,
               "fieldIds": [230], "errorType": 1, "counterType": 0, "sourceFilter": 0,
               "cpuSetSize": 1, "timeStamp": 0, "p2pIndex": 2, "eventTypes": 0x8,
               "eventSet": event_set, "timeoutms": 0, "pciBusId": "00000000:18:00.0",
               "gpuFabricInfo": ctypes.byref(fake_pynvml.c_nvmlGpuFabricInfo_v2_t())}
    params = inspect.signature(getattr(fake.module, name)).parameters.values()
    return [by_name[p.name] for p in params if p.default is inspect.Parameter.empty]


def test_after_the_last_shutdown_every_call_but_the_no_init_rows_answers_uninitialized():
    fake = FakeNvml([FakeGpu()])
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlShutdown()
    for name, errors in DOCUMENTED_ERRORS.items():
        if NO_INIT in errors:
            continue
        with pytest.raises(fake.module.NVMLError_Uninitialized):
            getattr(fake.module, name)(*_arguments(fake, name, handle))


def test_nvml_counts_its_inits_so_one_shutdown_of_two_inits_leaves_it_running():
    fake = FakeNvml([FakeGpu()])
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 1
    fake.nvmlShutdown()
    with pytest.raises(fake.module.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(fake.module.NVMLError_Uninitialized):
        fake.nvmlShutdown()


@pytest.mark.parametrize("field_name, error", [
    ("unsupported", "NotSupported"), ("denied", "NoPermission"),
    ("racing", "InsufficientSize")])
def test_an_injected_error_is_raised_where_documented_and_refused_elsewhere(field_name, error):
    for name, errors in DOCUMENTED_ERRORS.items():
        gpu = FakeGpu(**{field_name: {name}})
        fake = FakeNvml([gpu])
        fake.nvmlInit()
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        params = inspect.signature(getattr(fake.module, name)).parameters
        if not {"handle", "device", "device1"} & set(params):
            continue  # not a device call: nothing per GPU to inject
        call = getattr(fake.module, name)
        if error in errors:
            with pytest.raises(getattr(fake.module, f"NVMLError_{error}")):
                call(*_arguments(fake, name, handle))
        else:
            with pytest.raises(AssertionError, match="does not document"):
                call(*_arguments(fake, name, handle))


def test_a_field_the_gpu_lacks_answers_not_supported_in_its_own_entry_not_for_the_call():
    fake = FakeNvml([FakeGpu(field_values={})])
    fake.nvmlInit()
    values = fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(0), [303, 230])
    assert [v.nvmlReturn for v in values] == [fake.module.NVML_ERROR_NOT_SUPPORTED, 0]
    with pytest.raises(fake.module.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(0), [])


@pytest.mark.parametrize("fault", [
    # More processes started between pynvml's sizing call and its read: a race.
    {"racing": {"nvmlDeviceGetComputeRunningProcesses"}, "pids": [11]},
    # A MIG GPU's process list, to an unprivileged user.
    {"denied": {"nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses"}}], ids=["racing", "denied"])
def test_a_process_list_nvml_cannot_give_is_na_never_a_failed_gpu_query(monkeypatch, fault):
    result = _probe(monkeypatch, FakeNvml([FakeGpu(**fault), FakeGpu()]))
    findings = [f for s in result.sections for f in s.findings]
    assert not [f for f in findings if f.status is Status.FAIL]
    assert [f.status for f in findings if f.check == "gpu.busy"] == [Status.SKIP, Status.OK]
    assert result.gpus[0].recovery_action == "none"  # the rest of the GPU was read
