"""NVFP4 linear layers on the sm120 kernels: repack a loaded layer, apply it.

fp4_linear (the hook of `--fp4-gemm-backend sm120`) calls these after the self-check passed;
fp4_selfcheck runs its synthetic layer through them, so it checks the glue a real layer uses.

Layer contract (as upstream's create_weights leaves it): `weight` uint8 [N, K/2], `weight_scale`
float8_e4m3fn [N, K/16], `weight_scale_2` fp32 [partitions], `input_scale` fp32 [partitions].
After repack: `weight` holds the packed tiles [N_pad, K_pad/2], `weight_scale` the 128x4
swizzled scales, and `sm120_weight_scale_2` / `sm120_input_scale` / `sm120_input_scale_inv`
fp32 [1] device scalars (no host reads in apply, so it is CUDA-graph capturable).

Path choice per call (M = tokens):
  * M <= SGLANG_SM120_FP4_W4A16_MAX_M (default 64): W4A16 (bf16 activations, no activation
    quantization) -- decode is memory-bound, this is the fast and the more accurate path;
  * larger M: W4A4 -- activations quantized with the checkpoint's input_scale, block-scaled FP4
    MMA on SM120, its bit-faithful emulation elsewhere (so SM90 reproduces SM120 numerics).
    SGLANG_SM120_FP4_LARGE_M=w4a16 keeps W4A16 for every M instead.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from sglang.sm120 import kernels, settings
from sglang.sm120.kernels import ops as kops

logger = logging.getLogger(__name__)

W4A16_MAX_M = settings.integer("SGLANG_SM120_FP4_W4A16_MAX_M")
LARGE_M_PATH = settings.choice("SGLANG_SM120_FP4_LARGE_M")


def _rebind(layer: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    # Upstream's helper keeps Parameter identity stable for graphs and weight reloads; without a
    # fork build of sglang (kernel tests in a bare environment) a plain Parameter does the same job.
    from sglang.sm120 import upstream_api

    if upstream_api.upstream_present():
        upstream_api.require("copy_or_rebind_param")(layer, name, value)
    else:
        setattr(layer, name, torch.nn.Parameter(value.detach(), requires_grad=False))


_placeholder_warned = False


def packable_scales(block_scales: torch.Tensor, global_scales: torch.Tensor, where: str):
    """(block_scales, global_scales) as the packers take them. `--load-format dummy` (upstream's
    initialize_dummy_weights) fills every float parameter, NVFP4 scales included, with
    U(-1e-3, 1e-3): negative e4m3 block scales and (0.5.16; 0.5.23 sets them to 1) global scales
    <= 0, which no checkpoint holds and the packers refuse. Such values are taken by magnitude (a global scale of 0 becomes 1),
    with one warning per process, so the layer packs and a benchmark reads the bytes real weights
    would; upstream's kernels read them as they are. NaN stays NaN (the packers refuse it)."""
    global _placeholder_warned
    raw = block_scales.view(torch.uint8)
    negative_blocks = bool((raw > 0x80).any())  # 0x80 is -0: harmless
    g = global_scales.float()
    bad_globals = bool((g <= 0).any())
    if not (negative_blocks or bad_globals):
        return block_scales, global_scales
    if not _placeholder_warned:
        _placeholder_warned = True
        logger.warning("%s: NVFP4 scales no checkpoint holds (negative block scales or global scales <= 0, as "
                       "--load-format dummy writes them): taking their magnitudes (logged once per process)", where)
    if negative_blocks:
        block_scales = (raw & 0x7F).view(block_scales.dtype)
    if bad_globals:
        global_scales = torch.where(g == 0, torch.ones_like(g), g.abs()).to(global_scales.dtype)
    return block_scales, global_scales


def uses_w4a16(m: int) -> bool:
    """Whether apply() runs a call of M tokens on the W4A16 path (else W4A4)."""
    return m <= W4A16_MAX_M or LARGE_M_PATH == "w4a16"


def repack(layer: torch.nn.Module) -> None:
    """Repack a loaded ModelOpt NVFP4 linear layer into the kernel layout (once, at load time)."""
    require_kernels()
    weight = layer.weight.data
    scale, ws2_parts = packable_scales(layer.weight_scale.data, layer.weight_scale_2.data.float().reshape(-1),
                                       f"NVFP4 linear layer {tuple(weight.shape)}")
    _, in_parts = packable_scales(scale[:0], layer.input_scale.data.float().reshape(-1), "its input scale")
    ws2 = ws2_parts.max()
    if ws2_parts.numel() > 1 and not bool(torch.all(ws2_parts == ws2)):
        # ModelOpt gives fused q/k/v and gate/up one shared weight_scale_2; upstream takes the max
        # too. Different values would need the block scales rescaled, which is not exact.
        logger.warning("NVFP4 layer with per-partition weight_scale_2 %s: using the max like upstream",
                       ws2_parts.tolist())
    in_s = in_parts.max()
    pw = kernels.pack_weight(weight, scale, ws2)
    n, k = pw.n, pw.k
    _rebind(layer, "weight", pw.qweight.view(pw.n_pad, pw.k_pad // 2))
    _rebind(layer, "weight_scale", pw.scales)
    _rebind(layer, "sm120_weight_scale_2", pw.weight_scale_2.reshape(1))
    _rebind(layer, "sm120_input_scale", in_s.reshape(1).to(weight.device))
    _rebind(layer, "sm120_input_scale_inv", (1.0 / in_s).reshape(1).to(weight.device))
    layer.sm120_shape = (n, k)
    layer.output_size_per_partition = n
    kops._check_weight(packed_weight(layer), weight.device)  # once here; apply() only checks x
    kernels.workspace(weight.device)  # this stream's split-K workspace exists before any capture


def require_kernels(flag: str = "--fp4-gemm-backend sm120") -> None:
    """RuntimeError naming why (and `flag`, what needs it), when the kernel library cannot be loaded."""
    if kernels.available():
        return
    try:
        kernels.load()
        why = "unknown"
    except RuntimeError as exc:
        why = str(exc)
    raise RuntimeError(f"{flag} needs libsm120_kernels.so: " + why)


def packed_weight(layer: torch.nn.Module) -> kernels.PackedWeight:
    n, k = layer.sm120_shape
    return kernels.PackedWeight(qweight=layer.weight.data, scales=layer.weight_scale.data,
                                weight_scale_2=layer.sm120_weight_scale_2.data, n=n, k=k)


def apply(layer: torch.nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for a layer processed by process_weights_after_loading."""
    if isinstance(x, tuple):
        raise TypeError("the sm120 FP4 backend takes bf16 activations, not pre-quantized FP4 tuples")
    pw = packed_weight(layer)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m == 0:
        return x.new_empty((*lead, pw.n))
    if bias is not None and bias.dtype != x2.dtype:
        bias = bias.to(x2.dtype)
    kops.check_activation(x2, pw.k, bias, pw.n)
    if uses_w4a16(m):
        y = kops.layer_w4a16(x2, pw, bias)
    else:
        y = kops.layer_w4a4(x2, layer.sm120_input_scale.data, layer.sm120_input_scale_inv.data, pw, bias)
    return y.reshape(*lead, pw.n)
