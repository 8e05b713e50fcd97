"""What another user can write is data: a forged Xid inside another kernel message, a
state dir or state file another user could change, a damaged state file, option
extremes and a non-UTF-8 locale or HCA name never drain a node, hang, or traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck import cli, subject
from gpucheck.health.state import SET_ASIDE, STATE_FILE
from gpucheck.probes.kernel_log import read_file, scan_lines
from gpucheck.render.headline import worst_finding
from gpucheck.report import Report, Section, Status, warn
from tests.health_fakes import BUS, DBE, add_port, run_health, state_node, write_log, xid_line

REPO = Path(__file__).resolve().parents[1]
FAKE_SITE = REPO / "tests" / "fake_nvml_site"
FORGED = [  # text any user can put into the kernel log, with "NVRM: Xid" inside it
    "[ 1283.200000] tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:18:00): 79'\n",
    "Nov 26 10:00:00 node7 kernel: [ 1283.2] tmpfs: Unknown parameter "
    "'NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.'\n",
    "2026-11-26T10:00:00+0000 node7 kernel: ext4: bad option 'NVRM: Xid (PCI:0000:18:00): 48,'\n",
    # a kernel that stamps nothing (printk.time=0) starting a message with a task's name:
    # "host kernel:" is a prefix only after a syslog or journal stamp
    "a kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n",
]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return state_node(tmp_path, monkeypatch)


_run = run_health


def _state_warnings(report: Report) -> list[str]:
    return [f.message for f in report.findings if f.check == "health.state"]


# ---- item 2: NVRM only where the driver writes it ----

@pytest.mark.parametrize("line", FORGED)
def test_a_forged_xid_inside_another_message_is_not_an_xid(line):
    assert scan_lines([line]).events == []


def test_a_forged_boot_banner_does_not_cut_earlier_xids_away(tmp_path):
    log = write_log(tmp_path / "kern.log", [
        DBE, "[ 200.0] tmpfs: Unknown parameter '] Linux version 6.8.0'\n"])
    assert [e.xid for e in read_file(str(log)).events] == [48]


# ---- item 3: the state dir and file are trusted only when they are this user's ----

def test_a_state_file_linked_elsewhere_is_not_followed_nor_written_through(node):
    target = node / "victim.conf"
    target.write_text("precious\n")
    (node / "state" / STATE_FILE).symlink_to(target)
    report = _run(node)
    assert any("symbolic link" in m for m in _state_warnings(report))
    assert target.read_text() == "precious\n"
    assert not (node / "state" / STATE_FILE).is_symlink()
    assert (node / "state" / SET_ASIDE).is_symlink()  # the link itself, set aside


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge"])
def test_a_state_file_that_is_no_state_is_a_warn_within_the_budget(node, kind):
    path = node / "state" / STATE_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:  # 12 MB of a state gpucheck could have written, one problem repeated
        last = {"verdict": "WARN", "at": "x", "problems": ["gpu.x|GPU 0"] * 800_000}
        path.write_text(json.dumps({"version": 2, "consumers": {"default": {"last": last}}}))
    report = _run(node, budget_s=2)
    assert len(_state_warnings(report)) == 1
    assert (node / "state" / STATE_FILE).is_file()  # replaced by a good one
    assert _state_warnings(_run(node, set_healthy=True)) == []


def test_a_state_file_of_another_user_is_not_trusted(node):
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another uid")
    _run(node, [DBE])
    os.chown(node / "state" / STATE_FILE, 12345, 12345)
    assert any("uid 12345" in m for m in _state_warnings(_run(node)))


@pytest.mark.parametrize("how", ["others_write", "other_owner"])
def test_a_state_dir_another_user_could_write_is_a_usage_error(node, how, monkeypatch, capsys):
    shared = node / "shared"
    shared.mkdir()
    if how == "others_write":
        shared.chmod(0o1777)
    elif os.geteuid() == 0:
        os.chown(shared, 12345, 12345)
    else:
        pytest.skip("only root can give a directory to another uid")
    code = cli.main(["health", "--sysfs", str(node / "sys"), "--kernel-log",
                     str(node / "dmesg.txt"), "--state-dir", str(shared)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--state-dir" in err
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("how", ["others_parent", "others_write_parent", "others_grandparent"])
def test_a_state_dir_under_a_directory_another_user_may_change_is_a_usage_error(
        node, how, capsys):
    """Root's own 0755 state dir in alice's home: alice renames it away and puts her
    own (or a link) in its place between runs (issue 34, item 11)."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a directory to another uid")
    home = node / "home"
    state = home / "alice" / "gpucheck"
    state.mkdir(parents=True, mode=0o755)
    if how == "others_parent":
        os.chown(home / "alice", 12345, 12345)
    elif how == "others_write_parent":
        (home / "alice").chmod(0o777)  # writable by all, not sticky
    else:
        os.chown(home, 12345, 12345)
    code = cli.main(["health", "--sysfs", str(node / "sys"), "--kernel-log",
                     str(node / "dmesg.txt"), "--state-dir", str(state / "new")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "another user could move it" in err
    assert list(state.iterdir()) == []  # nothing made under it either


def test_a_state_dir_under_root_s_directories_and_a_sticky_one_is_taken(node):
    (node / "sticky").mkdir()
    (node / "sticky").chmod(0o1777)  # as /tmp: no one may move root's entry away
    from gpucheck.health.state import checked_state_dir

    assert checked_state_dir(str(node / "sticky" / "state")) == node / "sticky" / "state"


def test_a_stop_signal_during_the_state_s_fsync_leaves_no_temp_file(node, monkeypatch):
    """SIGTERM from the scheduler while the state is synced (issue 34, item 11)."""
    import signal

    from gpucheck.health import state as state_module

    def fsync_then_stopped(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # gpucheck's handler raises here
    monkeypatch.setattr(state_module.os, "fsync", fsync_then_stopped)
    code = cli.main(["health", "--sysfs", str(node / "sys"), "--kernel-log",
                     str(node / "dmesg.txt"), "--state-dir", str(node / "state"), "-q"])
    assert code == 128 + signal.SIGTERM
    assert sorted(p.name for p in (node / "state").iterdir()) == []


def test_a_state_dir_that_is_another_users_link_is_a_usage_error(node, capsys):
    """In a sticky world-writable dir another user links the name root will be given to
    a directory of root's: root followed it and wrote its state there (before)."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a link to another uid")
    shared, victim = node / "shared", node / "victim"
    shared.mkdir()
    shared.chmod(0o1777)
    victim.mkdir(mode=0o755)
    link = shared / "gpucheck-state"
    link.symlink_to(victim)
    os.lchown(link, 12345, 12345)
    code = cli.main(["health", "--sysfs", str(node / "sys"), "--kernel-log",
                     str(node / "dmesg.txt"), "--state-dir", str(link)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "uid 12345" in err
    assert list(victim.iterdir()) == []


def test_the_state_is_written_by_rename_and_never_through_a_link_made_meanwhile(node):
    _run(node)
    assert sorted(p.name for p in (node / "state").iterdir()) == [STATE_FILE]
    assert (node / "state" / STATE_FILE).stat().st_mode & 0o022 == 0


def test_the_worst_finding_of_many_thousand_is_the_first_most_severe():
    findings = [warn("gpu.busy", f"m{i}", "h", subject.gpu(i)) for i in range(5_000)]
    report = Report(command="health")
    report.add(Section("s", "S", {}, findings))
    assert worst_finding(report).subject == subject.gpu(0)


# ---- item 8: a damaged state file is set aside, replaced, and FAILs until cleared ----

@pytest.mark.parametrize("content", [
    {"version": 2, "consumers": {"default": {"last": {"problems": 5}}}},
    {"version": 2, "consumers": {"default": {"last": []}}},
    {"version": 2, "consumers": {"default": {"kernel_log": "x"}}},
    {"version": 2, "consumers": {"default": {"kernel_log": {"tail": "ab"}}}},
    {"version": 2, "consumers": {"default": {
        "ib_ports": {"mlx5_0/1": {"counters": {"link_downed": "1"}}}}}},
    {"version": 2, "consumers": {"default": {"ib_ports": {"mlx5_0/1": 3}}}},
    {"version": 2, "gpus": {"most_seen": "8"}},
    # another version: version 1 of the first days (no longer read, issue 25), a newer one
    {"version": 1, "kernel_log": {"last_event": "ab", "source": "dmesg"}},
    {"version": 3, "consumers": {}},
    {"version": 2, "consumers": {"default": {"kernel_log": {"tail": [1]}}}},
    {"version": 2, "consumers": {"../x": {}}},
    {"version": 2, "faults": [{"key": "k"}]},
    {"version": 2, "faults": [{"key": "k", "check": "c", "status": "OK", "action": "none",
                               "message": "m", "since": "t"}]},
    # a check id this gpucheck does not declare (its finding could not be made)
    {"version": 2, "faults": [{"key": "k", "check": "brand.new", "status": "FAIL",
                               "action": "drain-node", "message": "m", "since": "t"}]},
    {"version": True},
    [1, 2],
    "text",
])
def test_a_damaged_state_file_fails_is_set_aside_and_holds_until_cleared(node, content):
    path = node / "state" / STATE_FILE
    path.write_text(json.dumps(content))
    report = _run(node, [DBE])
    (message,) = _state_warnings(report)
    assert SET_ASIDE in message and "--set-healthy" in message
    assert json.loads((node / "state" / SET_ASIDE).read_text()) == content
    assert [f.status for f in report.findings if f.check == "kernel_log.xid"] == [Status.FAIL]
    assert len(_state_warnings(_run(node, [DBE]))) == 1  # not known healthy: still FAIL
    assert _state_warnings(_run(node, [DBE], set_healthy=True)) == []


def test_a_set_aside_file_left_by_an_older_gpucheck_beside_a_good_state_holds_nothing(node):
    """Older versions set a bad file aside and went on (every node that ran version 1
    has one): after the upgrade, a good state with no mark of an unread one is healthy."""
    _run(node)
    (node / "state" / SET_ASIDE).write_text('{"version": 1}')
    assert _state_warnings(_run(node)) == []


def test_a_state_set_aside_with_no_new_one_written_since_still_holds(node):
    """The run that set it aside could not write a new one (stopped, disk full): the
    next run still does not know the node to be healthy."""
    (node / "state" / SET_ASIDE).write_text('{"version": 3}')
    (message,) = _state_warnings(_run(node))
    assert "no state written since" in message
    assert _state_warnings(_run(node)) == [message]  # the run above wrote a marked state
    assert _state_warnings(_run(node, set_healthy=True)) == []
    assert not (node / "state" / SET_ASIDE).exists()


# ---- item 12: any locale, any HCA name ----

def _subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (REPO, FAKE_SITE))),
            "GPUCHECK_FAKE_NVML": json.dumps({"gpus": [{}]}), **extra}


def test_a_latin_1_terminal_gets_the_text_report_not_a_traceback(node):
    sample = "An uncorrectable double bit error " + "x" * 200  # truncated with "…"
    write_log(node / "dmesg.txt", [xid_line(1.0, BUS, 48, sample)])
    done = subprocess.run([sys.executable, "-m", "gpucheck", "health", "--sysfs",
                           str(node / "sys"), "--kernel-log", str(node / "dmesg.txt")],
                          env=_subprocess_env(PYTHONIOENCODING="latin-1"),
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert b"XID 48" in done.stdout and b"xxx..." in done.stdout


def test_a_non_utf8_hca_name_is_a_valid_prometheus_label(node):
    parser = pytest.importorskip("prometheus_client.parser")
    add_port(node / "sys", "mlx5_0", state=1, phys=2)
    raw = os.fsencode(node / "sys/class/infiniband/mlx5_0")
    os.rename(raw, raw[:-1] + b"\xff")
    out = node / "health.prom"
    done = subprocess.run([sys.executable, "-m", "gpucheck", "health", "--sysfs",
                           str(node / "sys"), "--kernel-log", str(node / "dmesg.txt"),
                           "-o", str(out), "-q"], env=_subprocess_env(),
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_bytes().decode("utf-8")  # valid UTF-8, as the format requires
    samples = [s for f in parser.text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("check") == "ib.port.state"]
    assert [s.labels["hca"] for s in samples] == ["mlx5_\\xff"]


def test_a_non_utf8_hca_name_keeps_one_name_across_runs(node):
    add_port(node / "sys", "mlx5_0")
    raw = os.fsencode(node / "sys/class/infiniband/mlx5_0")
    os.rename(raw, raw[:-1] + b"\xff")
    first = _run(node)
    second = _run(node)
    assert _state_warnings(first) == _state_warnings(second) == []
    assert second.verdict() is Status.OK
    assert [f.subject.label for f in second.findings if f.check == "ib.port.state"] == [
        "mlx5_\\xff port 1"]


def test_a_state_file_others_may_write_is_not_trusted(node):
    _run(node, [DBE])
    (node / "state" / STATE_FILE).chmod(0o666)
    assert any("written by other users" in m for m in _state_warnings(_run(node)))
    assert (node / "state" / STATE_FILE).stat().st_mode & 0o022 == 0  # the new one
