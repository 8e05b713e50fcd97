"""The wheel a plain `pip install .` builds holds every module of gpucheck/ and the images.

An editable install finds every folder by itself, so only a built wheel shows a package
left out (the hand-kept package list once shipped without gpucheck.checks).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "gpucheck")


def _tree_files() -> set[str]:
    """Every module and shipped image under gpucheck/, as paths inside a wheel."""
    found = set()
    for path in (REPO / "gpucheck").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            found.add(path.relative_to(REPO).as_posix())
    return found


def _built_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """Build the wheel from a copy of the sources (a build writes build/ beside them)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("gpucheck-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_every_module_and_image_of_the_tree(tmp_path: Path) -> None:
    with _built_wheel(tmp_path) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("gpucheck/")}
    tree = _tree_files()
    assert sorted(tree - shipped) == []
    assert sorted(shipped - tree) == []
    assert any(n.startswith("gpucheck/sample_images/") and n.endswith(".png") for n in shipped)
    assert "gpucheck/checks/__init__.py" in shipped


def test_the_bench_finds_the_shipped_images_inside_the_package() -> None:
    from gpucheck.bench.model import default_images_dir

    folder = default_images_dir()
    assert folder == REPO / "gpucheck" / "sample_images"
    assert sorted(p.suffix for p in folder.iterdir() if p.suffix != ".md")


def _readme_block(name: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split(f"<!-- {name}:start -->")[1].split(f"<!-- {name}:end -->")[0]
    return "\n".join(line for line in block.splitlines()
                     if line.strip() and not line.startswith("```"))


def test_ci_runs_the_quick_start_with_a_plain_install_then_the_tests() -> None:
    quick_start = _readme_block("quick-start")
    assert ".venv/bin/pip install . " in quick_start and " -e " not in quick_start
    assert "gpucheck env" in quick_start and "gpucheck bench" in quick_start
    assert "pytest" in _readme_block("test-command")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.index("readme_command quick-start") < ci.index("readme_command test-command")
