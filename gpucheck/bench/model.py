"""What every bench rank runs: the model, the sample images and (CPU ranks) the tensors
re-placed in fresh memory between the timed loop's segments, and taking turns on the
node's cores in the timed loop (docs/bench.md, "Stragglers"; GPU ranks never rotate)."""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpucheck.errors import UsageError
from gpucheck.numa import cpulist

if TYPE_CHECKING:
    import torch


DTYPES = ("auto", "fp32", "fp16", "bf16")
WEIGHT_SEED = 0


@dataclass(frozen=True)
class WeightsChoice:
    """Where the weights come from: "random" (seeded), "imagenet" (torchvision cache), a path."""

    kind: str  # "random", "imagenet" or "path"
    path: str | None = None  # the state_dict file for "imagenet" (cache) and "path"


def classification_models() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model(name: str) -> None:
    models = classification_models()
    if name not in models:
        close = [m for m in models if m.startswith(name[:4])][:6] or models[:6]
        raise UsageError(f"--model {name!r} is not a torchvision classification model; "
                         f"try one of {', '.join(close)}")


def resolve_dtype(requested: str, device: str) -> str:
    """`auto`: bf16 on GPUs with native bf16 (Ampere and newer; `is_bf16_supported()`
    also says yes where bf16 is emulated), else fp16; fp32 on CPU."""
    if requested not in DTYPES:
        raise UsageError(f"--dtype {requested!r} is unknown; use one of {', '.join(DTYPES)}")
    if requested != "auto":
        return requested
    if device != "cuda":
        return "fp32"
    import torch

    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def resolve_weights(spec: str, model: str, download: bool) -> WeightsChoice:
    """Turn --weights into a file that exists now (downloading only with --download)."""
    if spec == "random":
        return WeightsChoice("random")
    if spec == "imagenet":
        return WeightsChoice("imagenet", _imagenet_file(model, download))
    if not Path(spec).is_file():
        raise UsageError(f"--weights {spec}: no such file; give random, imagenet or the path "
                         "of a saved state_dict")
    _check_state_dict(spec, model)
    return WeightsChoice("path", str(Path(spec).resolve()))


def _imagenet_file(model: str, download: bool) -> str:
    import torch
    import torchvision

    weights = torchvision.models.get_model_weights(model).DEFAULT
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(weights.url)
    if cached.is_file():
        return str(cached)
    if not download:
        raise UsageError(f"--weights imagenet: {cached} is not in the local cache; add "
                         "--download to fetch it, or use --weights random or a saved file")
    try:
        weights.get_state_dict(progress=False)  # downloads into the cache
    except (OSError, RuntimeError) as exc:
        raise UsageError(f"--weights imagenet: download of {weights.url} failed ({exc}); "
                         "are you offline? use --weights random or a saved file") from None
    return str(cached)


def _check_state_dict(path: str, model: str) -> None:
    """Load the file and fit it into the model here, before any rank starts."""
    import torchvision

    state = _load_state_dict(path)
    try:
        torchvision.models.get_model(model, weights=None).load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--weights {path} does not load into {model}: {first}; save "
                         f"{model}'s state_dict with torch.save(model.state_dict(), path)"
                         ) from None


def _load_state_dict(path: str) -> Mapping[str, Any]:
    """The file's state_dict; any exception torch.load raises on a bad file is bad input."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4" before failing
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else (
            type(exc).__name__)
        raise UsageError(f"--weights {path} is not a saved state_dict torch can read "
                         f"({reason}); save one with torch.save(model.state_dict(), path), "
                         "or use --weights random") from None
    if not isinstance(state, Mapping):
        raise UsageError(f"--weights {path} holds a {type(state).__name__}, not a state_dict; "
                         "save one with torch.save(model.state_dict(), path)")
    return state


def build_model(name: str, weights: WeightsChoice) -> torch.nn.Module:
    """The model in eval mode on the CPU, with the same weights on every rank."""
    import torch
    import torchvision

    torch.manual_seed(WEIGHT_SEED)
    model: torch.nn.Module = torchvision.models.get_model(name, weights=None)
    if weights.path is not None:
        state = torch.load(weights.path, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    return model.eval()


# Text notes beside the images are ignored quietly; any other unreadable file is reported.
NOTE_SUFFIXES = (".md", ".txt", ".rst")
RESIZE_PX = 256
CROP_PX = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageSet:
    """The readable images of a folder, in name order, and the files that were skipped."""

    folder: str
    files: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (file name, why)


@dataclass(frozen=True)
class Share:
    """One rank's images, chosen exactly as `DistributedSampler(shuffle=False)` would."""

    indices: tuple[int, ...]
    padded_total: int  # images after padding, over all ranks
    padding: int  # images repeated so that every rank gets the same count


def default_images_dir() -> Path:
    """The shipped sample images (package data, in the source tree and when installed)."""
    return Path(__file__).resolve().parents[1] / "sample_images"


def scan_images(folder: str | Path) -> ImageSet:
    """Decode every file of `folder` once; UsageError when none is a readable image."""
    path = Path(folder)
    if not path.is_dir():
        raise UsageError(f"--images {folder}: no such folder; give a folder of JPEG/PNG images")
    files: list[str] = []
    skipped: list[tuple[str, str]] = []
    for entry in sorted(p for p in path.iterdir() if p.is_file()):
        if entry.name.startswith(".") or entry.suffix.lower() in NOTE_SUFFIXES:
            continue  # notes that travel with images (SOURCES.md), hidden files
        problem = _unreadable(entry)
        if problem is None:
            files.append(entry.name)
        else:
            skipped.append((entry.name, problem))
    if not files:
        raise UsageError(f"--images {folder}: no readable image in it"
                         + (f" ({len(skipped)} file(s) skipped)" if skipped else "")
                         + "; give a folder of JPEG/PNG images")
    return ImageSet(str(path), tuple(files), tuple(skipped))


def _unreadable(path: Path) -> str | None:
    """None when `path` decodes as an image, else why not."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.convert("RGB").load()
    except UnidentifiedImageError:
        return "not an image"
    except (OSError, ValueError, SyntaxError) as exc:
        return f"cannot decode: {exc}"
    except Image.DecompressionBombError as exc:  # PIL's pixel cap: a few KiB, gigabytes
        return f"refused: {exc}"
    return None


def rank_share(n_images: int, rank: int, world_size: int) -> Share:
    """DistributedSampler's split: pad by repeating from the start, then take every Nth."""
    per_rank = math.ceil(n_images / world_size)
    total = per_rank * world_size
    order = list(range(n_images))
    order += (order * math.ceil(total / n_images))[: total - n_images]
    return Share(tuple(order[rank:total:world_size]), total, total - n_images)


def load_tensor(folder: str, files: tuple[str, ...]) -> torch.Tensor:
    """Decode, convert to RGB, resize 256, centre-crop 224, normalise: shape (n, 3, 224, 224)."""
    import torch
    from PIL import Image
    from torchvision import transforms

    preprocess = transforms.Compose([
        transforms.Resize(RESIZE_PX),
        transforms.CenterCrop(CROP_PX),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    tensors = []
    for name in files:
        with Image.open(Path(folder) / name) as image:
            tensors.append(preprocess(image.convert("RGB")))
    return torch.stack(tensors)


def fill_batch(images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A batch of exactly `batch_size` images, cycling through `images` as often as needed."""
    import torch

    repeats = math.ceil(batch_size / images.shape[0])
    return torch.cat([images] * repeats)[:batch_size].contiguous()


# Three iterations a segment: the default CPU loop (12 iterations) gets four
# placements; a median over fewer segments is moved by one unlucky placement.
ITERS_PER_SEGMENT = 3
# Each re-placement costs a copy of the weights and a barrier (the copy about 11 ms for
# ResNet50 on one core here), outside the timed windows but inside the run: a long
# --duration run does not need more placements than this to even out.
MAX_SEGMENTS = 8


def segment_sizes(iters: int, relayout: bool) -> tuple[int, ...]:
    """Iterations per segment of the timed loop: one segment unless `relayout`, else
    about ITERS_PER_SEGMENT each (at most MAX_SEGMENTS), the larger ones first."""
    if not relayout or iters < 2 * ITERS_PER_SEGMENT:
        return (iters,)
    count = min(MAX_SEGMENTS, iters // ITERS_PER_SEGMENT)
    base, extra = divmod(iters, count)
    return tuple(base + 1 if i < extra else base for i in range(count))


def relayout(module: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Every parameter and buffer of `module` copied into fresh memory in place (DDP's
    references stay valid); returns a fresh copy of `batch`."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            tensor.data = tensor.data.clone()
        return batch.clone()


# --- CPU ranks taking turns on the cores ---------------------------------------

# Short against an iteration (about 0.5 s for ResNet50 on a core) so that each one
# sees every block about equally; long against a migration (a few microseconds, and a
# refill of the core's caches).
PERIOD_S = 0.05


@dataclass(frozen=True)
class RotationPlan:
    """Which block of cores this rank runs on at any moment."""

    blocks: tuple[tuple[int, ...], ...]
    slot: int  # this rank's block in period 0: its local rank
    period_s: float = PERIOD_S

    def block_at(self, monotonic_s: float) -> tuple[int, ...]:
        period = int(monotonic_s // self.period_s)
        return self.blocks[(self.slot + period) % len(self.blocks)]

    def next_switch(self, monotonic_s: float) -> float:
        return (int(monotonic_s // self.period_s) + 1) * self.period_s

    def describe(self) -> str:
        """"cpus 0-1 in 2 blocks of 1, every 50 ms"."""
        every = sorted(c for block in self.blocks for c in block)
        return (f"cpus {cpulist(tuple(every))} in {len(self.blocks)} blocks of "
                f"{len(self.blocks[0])}, every {self.period_s * 1e3:.0f} ms")


def plan_rotation(allowed: Sequence[int], local_rank: int, local_world_size: int,
                  node_cpu_sets: Sequence[str | None]) -> RotationPlan | None:
    """The plan for a CPU rank; None with one rank on the node, fewer cores than ranks,
    or ranks bound to different CPUs by a launcher."""
    if local_world_size < 2 or len(set(node_cpu_sets)) != 1 or None in node_cpu_sets:
        return None
    size = len(allowed) // local_world_size
    if size < 1:
        return None
    cpus = sorted(allowed)
    blocks = tuple(tuple(cpus[i * size:(i + 1) * size]) for i in range(local_world_size))
    return RotationPlan(blocks, local_rank)


class CoreRotation:
    """While active, a thread moves every thread of this process to the plan's block at
    each switch; on exit they get their CPUs back. No plan: does nothing."""

    def __init__(self, plan: RotationPlan | None) -> None:
        self.plan = plan
        self.switches = 0
        self._allowed: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CoreRotation:
        if self.plan is not None:
            self._allowed = os.sched_getaffinity(0)
            self._move_to(self.plan.block_at(time.monotonic()))
            self._thread = threading.Thread(target=self._run, name="gpucheck-core-rotation",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._move_to(tuple(self._allowed))

    def _run(self) -> None:
        assert self.plan is not None
        while not self._stop.wait(max(0.0, self.plan.next_switch(time.monotonic())
                                      - time.monotonic())):
            self._move_to(self.plan.block_at(time.monotonic()))

    def _move_to(self, cpus: Sequence[int]) -> None:
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the thread ended since it was listed
                continue
        self.switches += 1


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread alone (pid 0 is the calling thread)
        return [0]
