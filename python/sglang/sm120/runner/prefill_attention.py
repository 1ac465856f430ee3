"""Which FlashInfer kernel family the captured (fixed request slot) prefill attention plans.

Upstream's FlashInfer backend builds its full-CUDA-graph prefill wrappers with its
`prefill_backend`, fixed to FA2: a paged kernel whose CUDA-graph plan splits the KV and merges the
parts (`PersistentVariableLengthMergeStates`). Eager prefill without a prefix runs the ragged FA3
kernel on SM90 instead. On the H200 (session 8, benchmarks/results/prefill-profile-h200-2026-12-01-s8.md)
the captured attention took 1.93 / 6.89 ms of GPU time at 1024 / 4096 tokens against eager's
1.05 / 3.19: most of layerwise prefill's gap to upstream's `breakable`.

SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa3 builds those wrappers with FlashInfer's FA3 paged
kernels (the same compiled module as the ragged FA3 prefill; SM90 only); `fa2` (the default)
keeps upstream's. Only the wrappers built while layerwise prefill captures take it: eager paths
keep their own. Not yet run on a GPU: off by default until measured (docs/runner.md 5.7).
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

ENV = "SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION"
CHOICES = ("fa2", "fa3")
DEFAULT = "fa2"


def requested() -> str:
    raw = os.environ.get(ENV, "").strip()
    if raw == "":
        return DEFAULT
    if raw not in CHOICES:
        raise ValueError(f"{ENV}={raw!r}: expected one of {', '.join(CHOICES)} (default {DEFAULT}, upstream's)")
    return raw


@contextlib.contextmanager
def wrappers_built_with(attn_backend, choice: Optional[str] = None) -> Iterator[None]:
    """While open, FlashInfer prefill wrappers that `attn_backend` creates use `choice`
    (default: the environment's); its own setting is put back on exit."""
    choice = requested() if choice is None else choice
    current = getattr(attn_backend, "prefill_backend", None)
    if choice == DEFAULT or current is None or current == choice:
        yield
        return
    attn_backend.prefill_backend = choice
    if not getattr(attn_backend, "_sm120_prefill_attention_logged", False):
        attn_backend._sm120_prefill_attention_logged = True
        logger.info("layerwise prefill: captured attention planned with FlashInfer %s (%s=%s; upstream: %s)",
                    choice, ENV, choice, current)
    try:
        yield
    finally:
        attn_backend.prefill_backend = current
