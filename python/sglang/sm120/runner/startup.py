"""Finishing layerwise capture once every runner of a model runner has warmed up.

Runners register themselves after their warm pass; `finish(model_runner)` (called from
capture_cuda_graphs right after the decode runner is built, patch 0104) arms the traps when
SGLANG_SM120_TRAPS asks for them and then captures prefill (the larger token counts first, so
decode reuses its pool memory) and decode.
"""
from __future__ import annotations

import logging
from typing import Dict, List

from .. import traps

logger = logging.getLogger(__name__)

_PENDING: Dict[int, List] = {}
_ORDER = {"prefill": 0, "decode": 1}


def begin(model_runner) -> None:
    """Called when a layerwise runner class is chosen (before the warm passes): starts the
    background builds of the FlashInfer modules serving needs outside the forward (prewarm.py)."""
    from .prewarm import start_background_builds

    start_background_builds(getattr(model_runner, "server_args", None))


def register(model_runner, runner) -> None:
    _PENDING.setdefault(id(model_runner), []).append(runner)


def pending(model_runner) -> List:
    return list(_PENDING.get(id(model_runner), []))


def finish(model_runner) -> None:
    runners = _PENDING.pop(id(model_runner), [])
    if not runners:
        return
    from .prewarm import (join_background_builds, warm_decode_positions, warm_dsa_index_gather,
                          warm_extend_positions, warm_flashinfer_kv_indices, warm_flashinfer_mla_prefill,
                          warm_kv_index_writes, warm_merge_state, warm_paged_allocator, warm_sampling)

    join_background_builds()
    warm_sampling(model_runner)
    warm_merge_state(model_runner)
    warm_extend_positions(model_runner)
    warm_decode_positions(model_runner)
    warm_kv_index_writes(model_runner)
    warm_flashinfer_kv_indices(model_runner)
    warm_paged_allocator(model_runner)
    warm_dsa_index_gather(model_runner)
    warm_flashinfer_mla_prefill(model_runner)
    if traps.arm_from_env("layerwise CUDA-graph capture"):
        logger.info(
            "layerwise: Dynamo/subprocess traps armed (%s)", traps.ENV_MODE
        )
    for runner in sorted(runners, key=lambda r: _ORDER.get(getattr(r, "phase", ""), 9)):
        runner.finish_layerwise_capture()
