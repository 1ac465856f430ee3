"""Upstream's NVFP4 linear backends (sglang 0.5.16 and the libraries it pins), set up the way
upstream sets them up, so the check can time ours beside each one this GPU runs.

sglang's own backends (`--fp4-gemm-backend flashinfer_cutlass|flashinfer_cudnn|flashinfer_trtllm|
marlin`) go through upstream's ModelOptFp4LinearMethod itself: create_weights, the checkpoint's
tensors, process_weights_after_loading and apply with that backend selected, exactly what a server
runs per layer (activation quantization included). Two kernels the same libraries ship but
sglang 0.5.16 does not select are called on the flashinfer_cutlass weight layout: FlashInfer
mm_fp4's `b12x` backend (the fastest public SM120 decode GEMM by published RTX 5090 figures) and sgl-kernel's
cutlass_scaled_fp4_mm. Every backend's result is held against the reference before it is timed;
one that does not import, refuses this GPU, fails, or computes off the reference is reported
unavailable with the reason.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch

# (name, what it is, reference it computes: "w4a4" quantizes activations, "w4a16" does not)
BACKENDS = (
    ("flashinfer_cutlass", "sglang --fp4-gemm-backend flashinfer_cutlass (upstream's choice on SM120)", "w4a4"),
    ("flashinfer_cudnn", "sglang --fp4-gemm-backend flashinfer_cudnn", "w4a4"),
    ("flashinfer_trtllm", "sglang --fp4-gemm-backend flashinfer_trtllm", "w4a4"),
    ("flashinfer_b12x", "FlashInfer mm_fp4 backend b12x (not an sglang 0.5.16 choice)", "w4a4"),
    ("sgl_kernel_cutlass", "sgl-kernel cutlass_scaled_fp4_mm (not an sglang 0.5.16 choice)", "w4a4"),
    ("marlin", "sglang --fp4-gemm-backend marlin, W4A16 (upstream's choice on SM80-SM90)", "w4a16"),
)
SGLANG_CHOICES = ("flashinfer_cutlass", "flashinfer_cudnn", "flashinfer_trtllm", "marlin")
# Upstream's activation quantization may round a value differently from the reference; a backend
# whose result is this far off computes something else (wrong layout, wrong scale).
SANITY_REL_ERR = 0.05


@dataclass
class Prepared:
    """One upstream backend on one weight: `op(layer, x)` -> y, and the layer copies to rotate."""

    name: str
    layers: list
    op: Callable


@contextmanager
def runner_backend(name: str):
    """sglang's process-wide FP4 GEMM backend set to `name` for the duration (restored after)."""
    from sglang.srt.layers.quantization import fp4_utils

    old = fp4_utils.FP4_GEMM_RUNNER_BACKEND
    fp4_utils.FP4_GEMM_RUNNER_BACKEND = fp4_utils.Fp4GemmRunnerBackend(name)
    try:
        yield
    finally:
        fp4_utils.FP4_GEMM_RUNNER_BACKEND = old


def _method():
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config, ModelOptFp4LinearMethod

    return ModelOptFp4LinearMethod(ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16))


def upstream_layer(q: dict, n: int, k: int, input_scale: torch.Tensor, backend: Optional[str]):
    """(method, layer) after upstream's create_weights, loading of `q` (modelopt tensors) and
    process_weights_after_loading with `backend` selected (None: the process's backend as it
    stands, and whatever processing changes about it stays)."""
    method = _method()
    layer = torch.nn.Module()
    method.create_weights(layer, k, [n], k, n, torch.bfloat16, weight_loader=lambda *a, **kw: None)
    dev = q["weight"].device
    layer.weight.data = q["weight"].clone()
    layer.weight_scale.data = q["weight_scale"].clone()
    layer.weight_scale_2.data = q["weight_scale_2"].reshape(1).float().to(dev)
    layer.input_scale.data = input_scale.reshape(1).float().to(dev)
    if backend is None:
        method.process_weights_after_loading(layer)
    else:
        with runner_backend(backend):
            method.process_weights_after_loading(layer)
    return method, layer


def clone_layer(layer: torch.nn.Module) -> torch.nn.Module:
    """A copy of a processed layer with every tensor cloned (aliases stay aliases), other
    attributes shared. copy.deepcopy cannot copy sglang's parameter classes (their __new__ takes
    other arguments than torch.nn.Parameter passes)."""
    memo: dict = {}

    def clone(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            data = t.data.clone() if isinstance(t, torch.nn.Parameter) else t.clone()
            memo[id(t)] = torch.nn.Parameter(data, requires_grad=False) if isinstance(t, torch.nn.Parameter) else data
        return memo[id(t)]

    c = torch.nn.Module()
    for name, p in layer._parameters.items():
        if p is not None:
            c._parameters[name] = clone(p)
    for name, b in layer._buffers.items():
        if b is not None:
            c._buffers[name] = clone(b)
    for name, v in vars(layer).items():
        if name.startswith("_") or name == "training":
            continue
        setattr(c, name, clone(v) if isinstance(v, torch.Tensor) else v)
    return c


def _direct_op(name: str) -> Callable:
    """y = x @ W^T through a kernel sglang 0.5.16 does not select, on the flashinfer_cutlass layout."""
    from sglang.srt.layers.quantization.fp4_utils import fp4_quantize

    if fp4_quantize is None:
        raise RuntimeError("flashinfer fp4_quantize is not importable")
    if name == "flashinfer_b12x":
        from flashinfer import mm_fp4

        def op(layer, x):
            xq, xs = fp4_quantize(x, layer.input_scale_inv)
            return mm_fp4(xq, layer.weight.T, xs, layer.weight_scale_interleaved.T, layer.alpha,
                          torch.bfloat16, backend="b12x")
        return op
    if name == "sgl_kernel_cutlass":
        from sgl_kernel import cutlass_scaled_fp4_mm

        def op(layer, x):
            xq, xs = fp4_quantize(x, layer.input_scale_inv)
            return cutlass_scaled_fp4_mm(xq, layer.weight, xs, layer.weight_scale_interleaved, layer.alpha,
                                         torch.bfloat16)
        return op
    raise ValueError(f"unknown direct backend {name!r}")


def prepare(name: str, q: dict, n: int, k: int, input_scale: torch.Tensor, copies: int) -> Prepared:
    """Backend `name` set up on one weight plus copies-1 deep copies (for rotation)."""
    if name in SGLANG_CHOICES:
        method, layer = upstream_layer(q, n, k, input_scale, name)

        def op(lay, x, _m=method, _name=name):
            with runner_backend(_name):
                return _m.apply(lay, x)
    else:
        op = _direct_op(name)
        _, layer = upstream_layer(q, n, k, input_scale, "flashinfer_cutlass")
    return Prepared(name, [layer] + [clone_layer(layer) for _ in range(copies - 1)], op)


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def sanity(prep: Prepared, x: torch.Tensor, ref: torch.Tensor) -> Optional[str]:
    """None when the backend's y on x is within SANITY_REL_ERR of ref, else why not."""
    y = prep.op(prep.layers[0], x)
    torch.cuda.synchronize()
    if tuple(y.shape) != tuple(ref.shape):
        return f"output shape {tuple(y.shape)}, expected {tuple(ref.shape)}"
    rel = float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))
    if not rel <= SANITY_REL_ERR:
        return f"result off the reference: relative error {rel:.3g} > {SANITY_REL_ERR}"
    return None


def names() -> List[str]:
    return [b[0] for b in BACKENDS]


def describe(name: str) -> str:
    return {b[0]: b[1] for b in BACKENDS}[name]


def reference_kind(name: str) -> str:
    return {b[0]: b[2] for b in BACKENDS}[name]
