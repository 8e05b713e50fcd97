"""The fake pynvml's event sets, field values and fault counters, held to pynvml's own
names, signatures, structs and behaviour (tests/test_nvml_health.py checks the rest)."""

from __future__ import annotations

import ctypes
import inspect

import pytest

from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu, FakeNvml

XID = 0x8


def _layout(struct: type) -> list[tuple[str, int, int]]:
    """(name, offset, size) per field, through nested structs and unions."""
    rows = []
    for name, kind in struct._fields_:
        field = getattr(struct, name)
        rows.append((name, field.offset, field.size))
        if issubclass(kind, (ctypes.Structure, ctypes.Union)):
            rows.extend((f"{name}.{n}", o, s) for n, o, s in _layout(kind))
    return rows


def test_every_fake_nvml_function_has_pynvmls_name_and_parameters():
    pynvml = pytest.importorskip("pynvml")
    module = FakeNvml([FakeGpu()]).module
    names = [n for n in dir(module) if n.startswith("nvml") and callable(getattr(module, n))
             and not isinstance(getattr(module, n), type)]
    assert "nvmlEventSetWait_v2" in names and "nvmlDeviceGetFieldValues" in names
    for name in names:
        real = getattr(pynvml, name)
        assert list(inspect.signature(getattr(module, name)).parameters) == list(
            inspect.signature(real).parameters), name


def test_the_structs_pynvml_returns_have_its_layout():
    pynvml = pytest.importorskip("pynvml")
    for name, struct in fake_pynvml.RETURNED_STRUCTS.items():
        real = getattr(pynvml, name)
        assert _layout(struct) == _layout(real), name
        assert ctypes.sizeof(struct) == ctypes.sizeof(real), name


def _started(**gpu) -> tuple[FakeNvml, object]:
    fake = FakeNvml([FakeGpu(**gpu)])
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0)


def test_an_empty_event_set_answers_nvmls_timeout_error():
    fake, handle = _started()
    event_set = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, XID, event_set)
    with pytest.raises(fake.module.NVMLError_Timeout) as raised:
        fake.nvmlEventSetWait_v2(event_set, 0)
    assert raised.value.value == fake.module.NVML_ERROR_TIMEOUT


def test_a_delivered_xid_comes_back_as_event_data():
    fake, handle = _started()
    event_set = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, XID, event_set)
    assert fake.deliver_event(0, XID, 79) == 1
    data = fake.nvmlEventSetWait_v2(event_set, 0)
    assert (data.eventType, data.eventData, data.gpuInstanceId) == (XID, 79, 0xFFFFFFFF)


def test_events_go_only_to_live_sets_registered_for_that_type():
    fake, handle = _started()
    xid_set, freed = fake.nvmlEventSetCreate(), fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, XID, xid_set)
    fake.nvmlDeviceRegisterEvents(handle, XID, freed)
    fake.nvmlEventSetFree(freed)
    assert fake.deliver_event(0, 0x2) == 0  # a DBE: nobody registered it
    assert fake.deliver_event(0, XID, 13) == 1


def test_registering_a_type_the_gpu_lacks_is_refused_as_nvml_does():
    fake, handle = _started(event_types=XID)
    with pytest.raises(fake.module.NVMLError_NotSupported):
        fake.nvmlDeviceRegisterEvents(handle, XID | 0x2, fake.nvmlEventSetCreate())


def test_gpus_are_found_by_bus_id_in_either_domain_width():
    fake, _ = _started(bus_id="00000000:9A:00.0")
    assert fake.nvmlDeviceGetIndex(fake.nvmlDeviceGetHandleByPciBusId("0000:9a:00.0")) == 0
    with pytest.raises(fake.module.NVMLError_NotFound):
        fake.nvmlDeviceGetHandleByPciBusId("0000:9b:00.0")
