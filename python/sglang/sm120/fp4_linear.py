"""NVFP4 linear layers on the sm120 kernels: the hook `--fp4-gemm-backend sm120` calls.

Hook (patch over python/sglang/srt/layers/quantization/modelopt_quant.py, ModelOptFp4LinearMethod):
  * process_weights_after_loading(layer): right after upstream sets
    `layer.output_size_per_partition`, call `process_weights_after_loading(layer)` from here and
    return when the backend is still sm120 (the first call self-checks the kernels on this GPU,
    fp4_selfcheck; on failure it switches the process to upstream's backend and leaves the layer
    untouched for upstream's processing);
  * apply(layer, x, bias): first thing, `return apply(layer, x, bias)` from here when the backend
    is sm120.
The layer glue itself (layout, path choice per M) is fp4_layer's.
"""
from __future__ import annotations

import torch

from sglang.sm120 import fp4_layer, fp4_selfcheck
from sglang.sm120.fp4_layer import apply  # noqa: F401 (the hook's apply)


def process_weights_after_loading(layer: torch.nn.Module) -> None:
    """Repack a loaded layer for the kernels, after the once-per-process self-check on this GPU
    passed; when it failed, the layer is left as loaded and the process backend is upstream's."""
    fp4_layer.require_kernels()
    n, half_k = layer.weight.shape
    if fp4_selfcheck.ensure_verified(n, 2 * half_k, layer.weight.device).ok:
        fp4_layer.repack(layer)
