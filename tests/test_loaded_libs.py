"""The NCCL actually mapped in the process, read from the library itself (issue 23 item
4): a stand-in libnccl built here, a ctypes-level stand-in, none mapped."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpucheck.distributed.nodes import NodeId, diff_findings, node_facts
from gpucheck.probes import torch_build as loaded
from gpucheck.probes.torch_build import nccl_loaded_finding
from gpucheck.report import Status

MAP_LINE = "7f00-7f10 r-xp 00000000 08:01 1234 {path}\n"


def _maps(tmp_path: Path, *paths: str) -> Path:
    maps = tmp_path / "maps"
    lines = ["5600-5700 r-xp 00000000 08:01 11 /usr/bin/python3.11\n",
             "7e00-7e10 rw-p 00000000 00:00 0 \n", "7e10-7e20 r--p 00000000 00:00 0 [heap]\n",
             MAP_LINE.format(path="/opt/x/libnccl-net.so")]
    maps.write_text("".join(lines + [MAP_LINE.format(path=p) for p in paths for _ in (1, 2)]))
    return maps


@pytest.fixture(scope="module")
def stand_in_nccl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real shared library whose ncclGetVersion says 2.23.4 (code 22304)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler here to build a stand-in libnccl")
    folder = tmp_path_factory.mktemp("site-nccl")
    source = folder / "nccl.c"
    source.write_text("int ncclGetVersion(int *v) { *v = 22304; return 0; }\n")
    library = folder / "libnccl.so.2"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)],
                   check=True, capture_output=True, timeout=60)
    return library


def test_the_mapped_stand_in_libnccl_reports_its_own_version(
        tmp_path: Path, stand_in_nccl: Path) -> None:
    ctypes.CDLL(str(stand_in_nccl))  # mapped, as LD_PRELOAD or the loader would have it
    found = loaded.loaded_nccl(_maps(tmp_path, str(stand_in_nccl)))
    assert (found.path, found.version) == (str(stand_in_nccl), "2.23.4")


class _FakeLib:
    def __init__(self, code: int, result: int = 0) -> None:
        self.code, self.result = code, result

    def ncclGetVersion(self, ref: Any) -> int:
        ref._obj.value = self.code
        return self.result


def test_a_ctypes_stand_in_gives_both_version_code_forms(tmp_path: Path) -> None:
    maps = _maps(tmp_path, "/site/nccl/lib/libnccl.so.2.21.5")
    assert loaded.loaded_nccl(maps, lambda p: _FakeLib(22105)).version == "2.21.5"
    assert loaded.loaded_nccl(maps, lambda p: _FakeLib(2708)).version == "2.7.8"
    failed = loaded.loaded_nccl(maps, lambda p: _FakeLib(0, result=3))
    assert failed.path == "/site/nccl/lib/libnccl.so.2.21.5" and failed.version is None


def test_no_libnccl_mapped_is_a_skip_with_why_not_a_crash(tmp_path: Path) -> None:
    found = loaded.loaded_nccl(_maps(tmp_path), lambda p: pytest.fail("nothing to open"))
    assert found.path is None and found.version is None and found.why
    finding = nccl_loaded_finding({"nccl_version": None, "nccl_loaded_version": None,
                                   "nccl_loaded_path": None, "nccl_loaded_note": found.why})
    assert (finding.check, finding.status) == ("torch.nccl_loaded", Status.SKIP)
    assert loaded.loaded_nccl(tmp_path / "no-such-maps").path is None


def test_a_library_that_will_not_open_is_said_not_raised(tmp_path: Path) -> None:
    def refuse(path: str) -> Any:
        raise OSError("cannot open shared object file")

    found = loaded.loaded_nccl(_maps(tmp_path, "/gone/libnccl.so.2"), refuse)
    assert found.path == "/gone/libnccl.so.2" and found.version is None and found.why


def test_this_process_reports_both_the_build_and_the_loaded_nccl() -> None:
    torch = pytest.importorskip("torch")
    from gpucheck.probes.torch_build import read_torch, torch_data

    data = torch_data(torch, read_torch(torch))
    assert {"nccl_version", "nccl_loaded_version", "nccl_loaded_path"} <= set(data)
    here = loaded.loaded_nccl()
    assert data["nccl_loaded_version"] == here.version
    if here.path is not None:  # a CUDA torch maps its libnccl at import
        assert Path(here.path).name.startswith("libnccl.so")
        assert nccl_loaded_finding(data).status is Status.OK


def _torch_section(build: str, mapped: str) -> dict[str, Any]:
    return {"verdict": "OK", "sections": [{"name": "torch", "title": "t", "findings": [],
            "data": {"nccl_version": build, "nccl_loaded_version": mapped}}]}


def test_two_nodes_with_different_loaded_nccl_are_called_different() -> None:
    nodes = [NodeId(0, "a"), NodeId(1, "b"), NodeId(2, "c")]
    reports = {nodes[0]: _torch_section("2.21.5", "2.21.5"),
               nodes[1]: _torch_section("2.21.5", "2.21.5"),
               nodes[2]: _torch_section("2.21.5", "2.23.4")}
    findings = diff_findings({n: node_facts(r) for n, r in reports.items()})
    assert [(f.check, f.status, f.subject.label) for f in findings] == [
        ("env.nodes.differ", Status.WARN, "node 2 (c)")]
    same = {n: _torch_section("2.21.5", "2.21.5") for n in nodes}
    assert [f.status for f in diff_findings({n: node_facts(r) for n, r in same.items()})] == [
        Status.OK]

