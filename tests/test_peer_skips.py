"""Why the peer-copy matrix is skipped: a one-GPU node is not a hidden GPU."""

from __future__ import annotations

import pytest

from gpucheck.stress import copies


@pytest.mark.parametrize(("visible", "local_ranks", "words"), [
    (1, 1, "one GPU in this run on this node: no peer"),
    (1, 4, "this process sees one GPU (CUDA_VISIBLE_DEVICES"),
    (2, 4, "local rank 0 sees 2 of the node's 4 GPUs"),
    (0, 1, "one GPU in this run on this node"),
])
def test_the_skip_names_the_real_reason(monkeypatch: pytest.MonkeyPatch, visible: int,
                                        local_ranks: int, words: str) -> None:
    monkeypatch.setattr(copies, "cuda_device_count", lambda torch: visible)
    assert copies.peer_matrix(local_ranks)["skipped"].startswith(words)
