"""The benchmark model: any torchvision classification model, weights, dtype.

Every check that can fail on user input runs in the launching process before any
rank starts (`check_model`, `resolve_weights`), so a typo is a one-line error.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucheck.errors import UsageError

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
    """`auto`: bf16 on GPUs with native bf16 (Ampere and newer), else fp16; fp32 on CPU.

    `is_bf16_supported()` alone also says yes on pre-Ampere GPUs, where bf16 runs
    emulated and far slower than fp16: the benchmark would measure the emulation.
    """
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
    """The file's state_dict; a file torch cannot read is bad input, not a crash.

    A corrupt or non-torch file fails in torch.load with whatever its bytes provoke
    (UnpicklingError, KeyError, EOFError, ...), so every exception is caught here.
    """
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
