"""Warm what the serving path JIT-compiles outside the model forward, before the traps arm.

The runners' warm pass covers every captured forward. Sampling is not part of the forward: with
sglang's default sampling backend (FlashInfer) the first non-greedy request JIT-builds the
sampling kernels (a compiler subprocess). Run each sampling entry point sglang uses once here.
Best effort: a failure is logged, never fatal (the trap would then name what still compiles).
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def warm_sampling(model_runner) -> None:
    if getattr(model_runner.server_args, "sampling_backend", None) != "flashinfer":
        return
    try:
        from sglang.srt.layers import sampler as S

        device = model_runner.device
        vocab = int(model_runner.model_config.vocab_size)
        probs = torch.softmax(torch.randn(2, vocab, device=device), dim=-1)
        top_ks = torch.full((2,), 8, dtype=torch.int32, device=device)
        top_ps = torch.full((2,), 0.9, dtype=torch.float32, device=device)
        min_ps = torch.full((2,), 0.05, dtype=torch.float32, device=device)
        S.top_k_top_p_sampling_from_probs(probs, top_ks, top_ps, filter_apply_order="joint")
        renormed = S.top_p_renorm_prob(S.top_k_renorm_prob(probs, top_ks), top_ps)
        S.min_p_sampling_from_probs(renormed, min_ps)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build FlashInfer sampling kernels: %s", e)
