"""Python environment probe: interpreter, venv/conda, where torch comes from, package
versions (from metadata, no pip subprocess), and torchvision's compiled ops run in a child
against this torch (`TorchvisionCheck`, started early and read last)."""

from __future__ import annotations

import glob
import importlib.metadata as md
import importlib.util
import json
import os
import select
import signal
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpucheck.report import Finding, Section, fail, ok, skip, warn

PACKAGES = ("torch", "torchvision", "pillow", "numpy", "tqdm", "psutil", "nvidia-ml-py")
DEPRECATED = {
    "pynvml": "the PyPI package `pynvml` is a deprecated wrapper around nvidia-ml-py",
    "nvidia-ml-py3": "`nvidia-ml-py3` is an unmaintained fork that shadows nvidia-ml-py",
}
TORCHVISION_TIMEOUT_S = 30.0


def package_version(name: str) -> str | None:
    """`pip show <name>`'s version, or None (a corrupt dist-info must not sink the probe)."""
    try:
        return md.version(name)
    except Exception:
        return None


def environment_kind() -> dict[str, Any]:
    """venv or conda (name, prefix); `conda info --envs` / `echo $VIRTUAL_ENV`."""
    is_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    conda_prefix = os.environ.get("CONDA_PREFIX")
    in_conda = (Path(sys.prefix) / "conda-meta").is_dir()
    kind = "venv" if is_venv else ("conda" if in_conda else "system")
    return {
        "environment": kind,
        "venv_prefix": sys.prefix if is_venv else None,
        "conda_env_name": os.environ.get("CONDA_DEFAULT_ENV") if conda_prefix else None,
        "conda_prefix": conda_prefix,
    }


def _under(path: str | None, prefix: str | None) -> bool:
    if not path or not prefix:
        return False
    try:
        return Path(path).resolve().is_relative_to(Path(prefix).resolve())
    except OSError:
        return False


def torch_origin() -> str | None:
    """The file `import torch` would load."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def torch_location_finding(origin: str | None) -> Finding:
    """Is torch from the active environment, or shadowed by user site / PYTHONPATH?"""
    check = "python.torch_location"
    if origin is None:
        return fail(check, "torch is not installed in this environment",
                    f"{sys.executable} -m pip install torch")
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if _under(origin, user_site):
        return warn(check, f"torch is imported from user site-packages ({origin}), shadowing "
                    f"the environment at {sys.prefix}",
                    "pip uninstall torch outside the env (pip uninstall --user torch), or "
                    "set PYTHONNOUSERSITE=1")
    if not _under(origin, sys.prefix):
        return warn(check, f"torch is imported from {origin}, outside the active environment "
                    f"{sys.prefix}", "check PYTHONPATH and sys.path; install torch into this "
                    "environment")
    return ok(check, f"torch comes from the active environment ({origin})")


def deprecated_findings(versions: dict[str, str | None]) -> list[Finding]:
    findings = []
    for name, why in DEPRECATED.items():
        if versions.get(name):
            findings.append(warn(f"python.deprecated.{name}", f"{name} {versions[name]} is "
                                 f"installed: {why}",
                                 f"pip uninstall {name} (keep nvidia-ml-py)"))
    return findings


def probe_pyenv() -> Section:
    versions = {name: package_version(name) for name in (*PACKAGES, *DEPRECATED)}
    origin = torch_origin()
    data: dict[str, Any] = {
        "python_version": sys.version.split()[0],
        "executable": sys.executable,
        "prefix": sys.prefix,
        **environment_kind(),
        "torch_file": origin,
        "user_site": site.getusersitepackages() if site.ENABLE_USER_SITE else None,
        "packages": {name: versions[name] for name in PACKAGES},
    }
    findings = [torch_location_finding(origin), *deprecated_findings(versions)]
    return Section("python", "Python environment", data, findings)


def torchvision_library() -> str | None:
    """torchvision's compiled ops library (_C_stable.so or _C.so), without importing it."""
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    where = next(iter(spec.submodule_search_locations))
    for stem in ("_C_stable", "_C"):
        for path in sorted(glob.glob(os.path.join(where, stem + ".*"))):
            if path.endswith((".so", ".pyd", ".dylib")):
                return path
    return None


def ops_check(torch: Any, library: str) -> dict[str, Any]:
    """Load torchvision's ops as torchvision/extension.py does and run one tiny nms, in a
    child: a library built for another torch can abort the process."""
    try:
        torch.ops.load_library(library)
        ops = torch.ops.torchvision
        cuda = int(ops._cuda_version())
        boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0],
                              [20.0, 20.0, 30.0, 30.0]])
        keep = ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
    except BaseException as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "library": library}
    return {"library": library, "cuda_version": cuda, "nms": keep,
            "torch_cuda": torch.version.cuda}


_SPAWN_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[2])
try:
    import torch
except BaseException as exc:
    print(json.dumps({"torch_error": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
from gpucheck.probes.pyenv import ops_check
print(json.dumps(ops_check(torch, sys.argv[1])))
"""


class TorchvisionCheck:
    """torchvision's compiled ops against this torch, in a child under a timeout: forked
    when torch is imported already (no second import), else spawned."""

    CHECK = "python.torchvision_ops"

    def __init__(self, torch: Any | None, timeout_s: float = TORCHVISION_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.library = torchvision_library()
        self.proc: subprocess.Popen[str] | None = None
        self.pid: int | None = None
        self.fd: int | None = None
        self.start_error: str | None = None
        if self.library is None:
            return
        try:
            if torch is not None and hasattr(os, "fork"):
                self._fork(torch, self.library)
            else:
                self._spawn(self.library)
        except OSError as exc:
            self.start_error = str(exc)

    def _fork(self, torch: Any, library: str) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into the caller's code
            try:
                os.close(read_fd)
                os.write(write_fd, json.dumps(ops_check(torch, library)).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        self.pid, self.fd = pid, read_fd

    def _spawn(self, library: str) -> None:
        root = str(Path(__file__).resolve().parents[2])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SPAWN_SCRIPT, library, root], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)

    def _remaining(self) -> float:
        return max(0.1, self.timeout_s - (time.monotonic() - self.started))

    def finding(self) -> Finding:
        if self.library is None or self.start_error:
            why = self.start_error or "torchvision (or its compiled _C library) is not installed"
            return warn(self.CHECK, f"cannot check torchvision's ops: {why}",
                        f"{sys.executable} -m pip install torchvision")
        try:
            returncode, out, err = self._collect()
        except subprocess.TimeoutExpired:
            return warn(self.CHECK, f"the torchvision ops check did not finish in "
                        f"{self.timeout_s:g} s", "run: python -c 'import torchvision.ops'")
        return torchvision_finding(returncode, out, err)

    def _collect(self) -> tuple[int, str, str]:
        if self.proc is not None:
            try:
                out, err = self.proc.communicate(timeout=self._remaining())
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
                raise
            return self.proc.returncode, out, err
        assert self.pid is not None and self.fd is not None
        return _read_child(self.pid, self.fd, self._remaining())


def _read_child(pid: int, fd: int, timeout_s: float) -> tuple[int, str, str]:
    """A forked child's JSON from `fd`; killed when it overruns `timeout_s`."""
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired("torchvision ops check", timeout_s)
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code, b"".join(chunks).decode("utf-8", "replace"), f"child exit status {code}"


def torchvision_finding(returncode: int, out: str, err: str) -> Finding:
    check = TorchvisionCheck.CHECK
    lines = out.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        tail = (err.strip().splitlines() or [f"exit status {returncode}"])[-1]
        return fail(check, f"loading torchvision's compiled ops crashed the interpreter: {tail}",
                    "reinstall torchvision built for this torch (same index URL as torch)")
    if "torch_error" in result:
        return skip(check, "torch does not import, so torchvision cannot be checked")
    hint = ("pip install --force-reinstall torch torchvision from the same index "
            "(e.g. --index-url https://download.pytorch.org/whl/cu124)")
    if "error" in result:
        return fail(check, f"torchvision's compiled ops do not load against this torch: "
                    f"{result['error']}", hint)
    cuda, torch_cuda = result.get("cuda_version", -1), result.get("torch_cuda")
    if cuda != -1 and torch_cuda is None:
        return fail(check, f"torchvision is a CUDA build (CUDA {cuda}) but torch is CPU-only",
                    hint)
    if cuda != -1 and torch_cuda and int(cuda) // 1000 != int(torch_cuda.split(".")[0]):
        return fail(check, f"torchvision was built with CUDA {cuda}, torch with {torch_cuda}",
                    hint)
    if result.get("nms") != [0, 2]:
        return fail(check, f"torchvision.ops.nms gave a wrong result {result.get('nms')}", hint)
    return ok(check, "torchvision's compiled ops load and run against this torch")
