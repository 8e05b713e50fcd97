"""GPU pairs are compared only with pairs of their own path class: NVL- and two-socket-
shaped topologies stay quiet, a pair slower than its own class is still caught, and a
cross-socket pair without P2P is as designed (fake NVML for the classes)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpucheck.comm.pairwise import second_look_steps
from gpucheck.comm.records import PairRow
from gpucheck.comm.verdicts import pair_findings
from gpucheck.measure import LookState
from gpucheck.probes.gpus import PairPath, pair_paths
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Status
from gpucheck.stress.copies import second_look
from gpucheck.stress.verdicts import class_suspects, p2p_findings
from gpucheck.subject import node
from tests.fake_pynvml import FakeGpu, FakeNvml

NODE0 = node(0)

NV, PCIE, SYS = "NV12", "NODE", "SYS"


def nvl_path(a: int, b: int) -> tuple[str, bool]:
    """An 8-GPU H100 NVL box: bridged pairs (0,1) (2,3) (4,5) (6,7), GPUs 0-3 on socket
    0 and 4-7 on socket 1; the driver refuses P2P across the sockets."""
    if a // 2 == b // 2:
        return NV, True
    return (PCIE, True) if a // 4 == b // 4 else (SYS, False)


NVL_GBPS = {NV: 150.0, PCIE: 40.0}


def _pair(src: int, dst: int, path: str, access: bool, gbps: float | None) -> dict[str, Any]:
    return {"src": src, "dst": dst, "peer_access": access, "gbps": gbps if access else None,
            **PairPath(path, 0 if access else 3).row()}


def nvl_matrix(slow: dict[tuple[int, int], float] | None = None) -> list[dict[str, Any]]:
    rows = []
    for s in range(8):
        for d in range(8):
            if s != d:
                path, access = nvl_path(s, d)
                rows.append(_pair(s, d, path, access,
                                  (slow or {}).get((s, d), NVL_GBPS.get(path, 0.0))))
    return rows


def two_socket_matrix(slow: dict[tuple[int, int], float] | None = None,
                      ) -> list[dict[str, Any]]:
    """Six PCIe GPUs: 0-4 on socket 0 (PXB, 25 GB/s), GPU 5 alone on socket 1 (SYS, P2P
    allowed at 9 GB/s): by the node's median GPU 5 looked slow every way."""
    rows = []
    for s in range(6):
        for d in range(6):
            if s != d:
                far = 5 in (s, d)
                rows.append(_pair(s, d, "SYS" if far else "PXB", True,
                                  (slow or {}).get((s, d), 9.0 if far else 25.0)))
    return rows


def _again(rows: list[dict[str, Any]], wanted: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The second look measures the same figures again (a real fault stays slow)."""
    by_pair = {(r["src"], r["dst"]): r for r in rows}
    return [by_pair[p] for p in wanted]


def _node(rows: list[dict[str, Any]]) -> dict[str, Any]:
    again = second_look(rows, 0.6, lambda wanted: _again(rows, wanted))
    return {"pairs": rows} | ({"again": again} if again else {})


@pytest.mark.parametrize("matrix", [nvl_matrix, two_socket_matrix])
def test_nvl_and_two_socket_boxes_stay_quiet(matrix: Any) -> None:
    found = p2p_findings(_node(matrix()), NODE0, 0.6)
    assert [f.status for f in found] == [Status.OK]


def test_cross_socket_pairs_without_p2p_are_as_designed_not_acs() -> None:
    (found,) = p2p_findings(_node(nvl_matrix()), NODE0, 0.6)
    assert found.status is Status.OK and "32 pair(s) without peer access across" in \
        found.message


def test_a_blocked_pair_under_one_socket_still_points_at_acs() -> None:
    rows = nvl_matrix()
    blocked = next(r for r in rows if (r["src"], r["dst"]) == (0, 2))
    blocked.update(peer_access=False, gbps=None, p2p_status="not supported",
                   p2p_by_design=False)
    found = p2p_findings(_node(rows), NODE0, 0.6)
    warned = [f for f in found if f.status is Status.WARN]
    assert len(warned) == 1 and warned[0].action == "fix-config"


@pytest.mark.parametrize(("matrix", "pair"), [(nvl_matrix, (4, 5)),
                                              (two_socket_matrix, (1, 2))])
def test_a_pair_slower_than_its_own_class_is_caught_and_confirmed(
        matrix: Any, pair: tuple[int, int]) -> None:
    rows = matrix({pair: 12.0 if pair == (1, 2) else 60.0})
    found = [f for f in p2p_findings(_node(rows), NODE0, 0.6) if f.status is Status.WARN]
    assert [(f.subject.label, f.action) for f in found] == [
        (f"node 0 cuda:{pair[0]}->cuda:{pair[1]}", "drain-node")]
    assert found[0].look is not None and found[0].look.state.value == "confirmed"


def test_the_second_look_asks_for_known_good_pairs_of_the_same_class() -> None:
    asked: list[list[tuple[int, int]]] = []
    rows = nvl_matrix({(4, 5): 60.0})
    second_look(rows, 0.6, lambda wanted: asked.append(wanted) or [])
    (wanted,) = asked
    paths = {(r["src"], r["dst"]): r["path"] for r in rows}
    assert (4, 5) in wanted and {paths[p] for p in wanted} == {NV}
    assert set(class_suspects(rows, 0.6)) == {"NV", PCIE}


def hgx_matrix(lost_links_gpu: int | None = None) -> list[dict[str, Any]]:
    """Four NVSwitch GPUs, 18 NVLinks each (NV18, 300 GB/s); a GPU that lost 6 links
    shows NV12 on its own row (topo -m's NV# is the row GPU's count) and sends at half."""
    rows = []
    for s in range(4):
        for d in range(4):
            if s != d:
                lost = s == lost_links_gpu
                rows.append(_pair(s, d, "NV12" if lost else "NV18", True,
                                  150.0 if lost else 300.0))
    return rows


def test_a_gpu_that_lost_nvlinks_is_no_class_of_its_own() -> None:
    """NV#'s number is the GPU's own active-link count: a GPU with links down made a
    class of its own pairs, each as slow as the others, and read OK (before)."""
    assert [f.status for f in p2p_findings(_node(hgx_matrix()), NODE0, 0.6)] == [
        Status.OK]
    found = [f for f in p2p_findings(_node(hgx_matrix(3)), NODE0, 0.6)
             if f.status is Status.WARN]
    assert {f.subject.label for f in found} == {f"node 0 cuda:3->cuda:{d}" for d in range(3)}
    names = {r: f"rank {r}" for r in range(4)}
    slow = _comm_pairs(hgx_matrix(3))
    warned = [f for f in pair_findings(slow, 0.6, names, again=slow)
              if f.status is Status.WARN]
    assert {f.subject.label for f in warned} == {f"rank 3 -> rank {d}" for d in range(3)}


# --- comm's send/recv pairs on a node -----------------------------------------------------


def _comm_pairs(rows: list[dict[str, Any]]) -> list[PairRow]:
    """stress-shaped rows as comm's: GB/s of three repeats, the pair's path."""
    return [PairRow(r["src"], r["dst"], 0, 1 << 28, v, (v, v * 0.99, v * 0.98), r["path"])
            for r in rows if (v := r["gbps"] if r["gbps"] is not None else 12.0)]


def test_comm_pairs_on_two_sockets_stay_quiet_and_a_slow_pair_of_a_class_is_caught() -> None:
    names = {r: f"rank {r}" for r in range(8)}
    quiet = pair_findings(_comm_pairs(nvl_matrix()), 0.6, names, again=[])
    assert [f.status for f in quiet] == [Status.OK]
    slow = _comm_pairs(nvl_matrix({(4, 5): 60.0}))
    again = [p for p in slow if (p.src, p.dst) in ((4, 5), (0, 1), (1, 0))]
    found = [f for f in pair_findings(slow, 0.6, names, again=again)
             if f.status is Status.WARN]
    assert [f.subject.label for f in found] == ["rank 4 -> rank 5"]
    assert found[0].look is not None and found[0].look.state is LookState.CONFIRMED


def test_a_nodes_classes_are_measured_again_one_pair_at_a_time() -> None:
    from gpucheck.comm.verdicts import suspects_by_node

    rows = _comm_pairs(nvl_matrix({(4, 5): 60.0, (0, 2): 10.0}))
    plans = {k: s for k, s in suspects_by_node(rows, 0.6).items() if not s.empty}
    assert {k[1] for k in plans} == {"NV", PCIE}
    steps = second_look_steps(plans)
    assert all(len(step) == 1 for step in steps)  # one node: never two pairs at once


# --- the classes from NVML ----------------------------------------------------------------


def nvl_nvml() -> FakeNvml:
    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + i:02X}:00.0", nvlinks=12) for i in range(4)]
    fake = FakeNvml(gpus, topology=40)
    for a in range(4):
        for b in range(a + 1, 4):
            pair = frozenset((a, b))
            bridged = a // 2 == b // 2
            fake.p2p_pairs[(pair, 2)] = 0 if bridged else 5  # NVLink P2P: bridge only
            if a // 2 != b // 2 and (a, b) in ((0, 2), (0, 3), (1, 2), (1, 3)):
                fake.topology_pairs[pair] = 50  # across the sockets
                fake.p2p_pairs[(pair, 0)] = 3  # IOH topology not supported
            else:
                fake.p2p_pairs[(pair, 0)] = 0
    return fake


def test_nvml_gives_each_pair_its_class_and_p2p_status(monkeypatch: pytest.MonkeyPatch,
                                                       ) -> None:
    fake = nvl_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    nvml = Nvml()
    try:
        paths = pair_paths(nvml, [g.bus_id for g in fake.gpus])
    finally:
        nvml.shutdown()
    assert paths[(0, 1)] == PairPath("NV12", 0) and paths[(3, 2)] == PairPath("NV12", 0)
    assert paths[(0, 2)].kind == "SYS" and paths[(0, 2)].without_p2p_by_design
    assert paths[(2, 1)].row()["p2p_status"] == "IOH topology not supported"


def test_a_gpu_nvml_cannot_find_has_no_class(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = nvl_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    nvml = Nvml()
    try:
        paths = pair_paths(nvml, [fake.gpus[0].bus_id, "00000000:99:00.0"])
    finally:
        nvml.shutdown()
    assert paths[(0, 1)] == PairPath("n/a", None)


def test_the_p2p_section_lists_the_path_classes() -> None:
    from gpucheck.stress.report import Verdicts, stress_sections

    ranks = [{"rank": r, "node_rank": 0, "host": "n0", "local_rank": r, "device": f"cuda:{r}",
              "gpu": f"GPU {r}", "gpu_name": "NVIDIA H100 NVL"} for r in range(8)]
    node = {"node_rank": 0, "host": "n0", "gpus": [{"nvml_index": i} for i in range(8)],
            **_node(nvl_matrix())}
    result = {"world_size": 8, "device": "cuda", "backend": "nccl", "dtypes": ["bf16"],
              "size": 8192, "duration_s": 30.0, "ranks": ranks, "gemm": None, "sdc": None,
              "membw": None, "copies": None, "p2p": {"nodes": [node]},
              "phases_planned": ["p2p"], "phases_done": ["p2p"]}
    section = next(s for s in stress_sections(result, Verdicts(0.9, 0.8, 0.6))
                   if s.name == "p2p")
    classes = section.data["node 0 (n0) path classes"]
    assert [(c["path"], c["pairs"], c["with_p2p"]) for c in classes] == [
        (PCIE, 16, 16), (NV, 8, 8), (SYS, 32, 0)]
