"""Benchmark inputs: find, decode and preprocess images once, share them between ranks.

Decoding happens before the clock starts; the timed loop only sees a tensor that
already sits on the device, so it measures the GPU, not JPEG decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucheck.errors import UsageError

if TYPE_CHECKING:
    import torch

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
    """Decode every file of `folder` once to learn which are usable images.

    Raises UsageError when the folder is missing or holds no readable image.
    """
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
