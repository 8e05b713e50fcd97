"""InfiniBand/RoCE ports from a fake sysfs tree: every healthy shape stays OK, each
fault (down, slow, flapping, too few) is caught and names the HCA and port."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpucheck.health.ib import IbOptions, judge_ports, read_ports
from gpucheck.report import Status
from tests.health_fakes import add_port, healthy_ib_node, set_counters, set_state

NOW = "2026-11-24T10:00:00+00:00"


def _judge(sysfs: Path, previous: dict | None = None, **options):
    return judge_ports(read_ports(sysfs), previous or {}, IbOptions(**options), NOW)


def _problems(judged) -> list[tuple[str, str, str | None]]:
    return [(f.check, f.status.value, f.subject and f.subject.label)
            for f in judged.section.findings
            if f.status in (Status.WARN, Status.FAIL)]


def test_ports_are_read_as_the_kernel_writes_them(tmp_path):
    add_port(tmp_path, "mlx5_0", rate="200 Gb/sec (4X HDR)", link_downed=3, symbol_error=7)
    (port,) = read_ports(tmp_path)
    assert (port.hca, port.port, port.state, port.state_name) == ("mlx5_0", 1, 4, "ACTIVE")
    assert (port.phys_state, port.phys_name, port.rate_gbps) == (5, "LinkUp", 200.0)
    assert port.link_layer == "InfiniBand" and port.hca_type == "MT4129"
    assert port.counters["link_downed"] == 3 and port.counters["symbol_error"] == 7


def test_four_active_ndr_rails_are_ok_for_every_check(tmp_path):
    judged = _judge(healthy_ib_node(tmp_path), expect_active=4)
    statuses = {(f.check, f.status) for f in judged.section.findings}
    assert {s for _, s in statuses} == {Status.OK}
    assert {c for c, _ in statuses} == {"ib.ports", "ib.port.state", "ib.port.rate"}


def test_a_node_without_infiniband_is_a_skip_not_a_fail(tmp_path):
    judged = _judge(tmp_path)
    (finding,) = judged.section.findings
    assert (finding.check, finding.status) == ("ib.ports", Status.SKIP)


def test_a_node_without_infiniband_fails_when_ports_are_expected(tmp_path):
    (finding,) = _judge(tmp_path, expect_active=2).section.findings
    assert finding.status is Status.FAIL and finding.action == "drain-node"


def test_a_port_disabled_by_the_admin_is_ok(tmp_path):
    healthy_ib_node(tmp_path, 2)
    add_port(tmp_path, "mlx5_1", port=2, state=1, phys=3)
    judged = _judge(tmp_path)
    assert _problems(judged) == []
    state = [f for f in judged.section.findings
             if f.subject is not None and f.subject.label == "mlx5_1 port 2"]
    assert "disabled by an administrator" in state[0].message


def test_a_port_never_seen_active_that_is_down_warns_and_names_it(tmp_path):
    healthy_ib_node(tmp_path, 2)
    add_port(tmp_path, "mlx5_1", port=2, state=1, phys=2)
    judged = _judge(tmp_path)
    assert _problems(judged) == [("ib.port.state", "WARN", "mlx5_1 port 2")]
    finding = next(f for f in judged.section.findings if f.status is Status.WARN)
    assert finding.action == "fix-config" and "--ib-ignore mlx5_1/2" in (finding.hint or "")


def test_a_port_seen_active_before_that_went_down_fails_until_it_is_back(tmp_path):
    healthy_ib_node(tmp_path, 4)
    first = _judge(tmp_path)
    set_state(tmp_path, "mlx5_2", 1, state=1, phys=2)
    second = _judge(tmp_path, first.remembered)
    assert _problems(second) == [("ib.port.state", "FAIL", "mlx5_2 port 1")]
    assert second.section.findings[0].check == "ib.ports"
    down = next(f for f in second.section.findings if f.status is Status.FAIL)
    assert down.action == "drain-node" and "mlx5_2" in (down.hint or "")
    third = _judge(tmp_path, second.remembered)  # still down: still a FAIL
    assert _problems(third) == [("ib.port.state", "FAIL", "mlx5_2 port 1")]
    set_state(tmp_path, "mlx5_2", 1, state=4, phys=5)
    assert _problems(_judge(tmp_path, third.remembered)) == []


def test_fewer_active_ports_than_expected_fails_naming_the_inactive_ones(tmp_path):
    healthy_ib_node(tmp_path, 3)
    add_port(tmp_path, "mlx5_3", state=1, phys=2)
    judged = _judge(tmp_path, expect_active=4)
    count = next(f for f in judged.section.findings if f.check == "ib.ports")
    assert count.status is Status.FAIL and "mlx5_3 port 1" in count.message


def test_a_port_slower_than_its_peers_warns_and_names_it(tmp_path):
    healthy_ib_node(tmp_path, 4)
    add_port(tmp_path, "mlx5_1", rate="200 Gb/sec (4X HDR)")
    judged = _judge(tmp_path)
    assert _problems(judged) == [("ib.port.rate", "WARN", "mlx5_1 port 1")]
    slow = next(f for f in judged.section.findings if f.status is Status.WARN)
    assert "200 Gb/sec" in slow.message and slow.action == "replace-hardware"


def test_a_slower_ethernet_port_is_not_compared_with_infiniband_rails(tmp_path):
    healthy_ib_node(tmp_path, 2)
    add_port(tmp_path, "mlx5_bond_0", rate="25 Gb/sec (1X EDR)", link_layer="Ethernet",
             hca_type="MT4125")
    assert _problems(_judge(tmp_path)) == []


def test_link_downed_growing_since_the_last_check_is_flapping(tmp_path):
    healthy_ib_node(tmp_path, 2)
    first = _judge(tmp_path)
    set_counters(tmp_path, "mlx5_0", 1, link_downed=2, symbol_error=40)
    second = _judge(tmp_path, first.remembered)
    assert _problems(second) == [("ib.port.link_downed", "WARN", "mlx5_0 port 1")]
    flap = next(f for f in second.section.findings if f.status is Status.WARN)
    assert "2 time(s)" in flap.message and "symbol_error +40" in flap.message
    assert flap.action == "drain-node"
    third = _judge(tmp_path, second.remembered)  # no new link-down: it clears
    assert _problems(third) == []
    assert any(f.check == "ib.port.link_downed" and f.status is Status.OK
               for f in third.section.findings)


def test_counters_that_went_down_were_reset_and_give_no_verdict(tmp_path):
    healthy_ib_node(tmp_path, 1)
    set_counters(tmp_path, "mlx5_0", 1, link_downed=5)
    first = _judge(tmp_path)
    set_counters(tmp_path, "mlx5_0", 1, link_downed=1)
    second = _judge(tmp_path, first.remembered)
    assert _problems(second) == []
    assert not any(f.check == "ib.port.link_downed" for f in second.section.findings)
    assert second.section.data["ports"][0]["change_since_last_check"] is None


def test_ignored_ports_are_not_judged(tmp_path):
    healthy_ib_node(tmp_path, 2)
    add_port(tmp_path, "mlx5_9", state=1, phys=2)
    judged = _judge(tmp_path, ignore=("mlx5_9",))
    assert _problems(judged) == [] and judged.section.data["ignored"] == ["mlx5_9/1"]


def test_a_port_seen_active_before_that_vanished_from_sysfs_fails_naming_it(tmp_path):
    healthy_ib_node(tmp_path, 2)
    first = _judge(tmp_path)
    shutil.rmtree(tmp_path / "class/infiniband/mlx5_1")
    second = _judge(tmp_path, first.remembered)
    assert _problems(second) == [("ib.port.state", "FAIL", "mlx5_1 port 1")]
    gone = next(f for f in second.section.findings if f.status is Status.FAIL)
    assert "missing" in gone.message and gone.action == "drain-node"
    assert _problems(_judge(tmp_path, second.remembered)) == _problems(second)  # stays
    assert _problems(_judge(tmp_path, second.remembered, ignore=("mlx5_1",))) == []


def test_every_hca_gone_after_being_seen_is_a_fail_not_a_skip(tmp_path):
    healthy_ib_node(tmp_path, 1)
    first = _judge(tmp_path)
    shutil.rmtree(tmp_path / "class/infiniband")
    assert _problems(_judge(tmp_path, first.remembered)) == [
        ("ib.port.state", "FAIL", "mlx5_0 port 1")]
