"""Every Python process started with this folder on PYTHONPATH (tests/plant.py puts it
there) patches gpucheck with the test plant named in its environment, if any. A rank
multiprocessing spawns does so once its parent's sys.path is in place (a fake pynvml
there must win over the real one)."""

import os
import sys


def _install() -> None:
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    import plant

    plant.install(plant.Plant.from_json(os.environ["GPUCHECK_TEST_PLANT"]))


if os.environ.get("GPUCHECK_TEST_PLANT"):
    if "--multiprocessing-fork" in sys.argv:
        from multiprocessing import spawn

        _prepare = spawn.prepare

        def _prepared(data: dict) -> None:  # type: ignore[type-arg]
            _prepare(data)
            _install()

        spawn.prepare = _prepared
    else:
        _install()
