"""Self-check of the sm120 NVFP4 GEMM backend: once per process, before it serves.

Why: `--fp4-gemm-backend auto` selects the fork's sm_120a kernels on SM120 GPUs, and a kernel that
computes wrong on some card must never serve silently. So the backend proves itself on the GPU it
runs on before the first layer is committed to it, and hands the process to upstream's backend
when it cannot.

When: fp4_linear.process_weights_after_loading calls ensure_verified() for the first NVFP4 linear
layer the process loads, before that layer's weights are repacked (load time: outside CUDA-graph
capture). Only the first layer's shape can decide: once a layer is repacked for our kernels, a
later switch of backend would leave it unreadable by upstream's.

What: a synthetic weight with the layer's K and N (N capped so the check holds at most
MAX_CHECK_ELEMENTS weight elements; the kernels tile N in 128-row groups, so the cap keeps every
code path while bounding memory at load time), repacked and applied through the same glue as a
real layer, at each M of CHECK_MS (W4A16 warp-K and split-K, W4A4 above the W4A16 limit), against
the fp32 product of the dequantized operands, with the tolerance of fp4_tolerance.

On a mismatch or an exception: ONE error line naming shape, M, path and error, then the process
falls back: fp4_backend stops offering sm120 to `auto`, and upstream's FP4 GEMM config is
re-initialized with `auto`, which picks upstream's backend for this GPU (flashinfer_cutlass on
SM120, marlin on SM80-SM90). A device fault (illegal address) kills the CUDA context: no fallback
can serve after that, the error stands.

Fault injection: SGLANG_SM120_FAULT_INJECT=gemm corrupts one element of the first GEMM result
this check compares (and the first one `python -m sglang.sm120 check` compares), to show the
fallback and the failing report on a GPU whose kernels are correct.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from sglang.sm120.selfcheck import FAULT_INJECT_ENV, FAULT_SITES, OnceCheck, corrupt_one, error_line, fault_site  # noqa: F401

logger = logging.getLogger(__name__)

CHECK_MS = (1, 16, 64, 128)  # warp-K, warp-K's largest M, split-K at the W4A16 limit, W4A4
MAX_CHECK_ELEMENTS = 16 << 20  # weight elements of the synthetic weight (64 MB as fp32 reference)


@dataclass
class Outcome:
    ok: bool
    n: int          # the layer's N and K
    k: int
    checked_n: int  # rows of the synthetic weight
    ms: tuple
    seconds: float
    m: Optional[int] = None     # the failing M
    path: str = ""              # the failing path
    error: str = ""
    fallback: str = ""          # upstream's backend the process switched to

    def passed(self) -> str:
        return (f"N={self.n} K={self.k} ({self.checked_n} rows checked), M={','.join(map(str, self.ms))}, "
                f"{self.seconds:.2f} s")

    def failure(self) -> str:
        return f"N={self.n} K={self.k} M={self.m} {self.path}: {self.error}"


def checked_rows(n: int, k: int) -> int:
    """Rows of the synthetic weight for a layer of N x K: all of them up to MAX_CHECK_ELEMENTS,
    else whole 128-row groups (at least one)."""
    if n * k <= MAX_CHECK_ELEMENTS:
        return n
    return max(128, (MAX_CHECK_ELEMENTS // k) // 128 * 128)


def _synthetic_layer(q: dict, input_scale):
    """A linear layer as upstream's ModelOptFp4LinearMethod leaves it after loading."""
    import torch

    layer = torch.nn.Module()
    p = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
    layer.weight = p(q["weight"].clone())
    layer.weight_scale = p(q["weight_scale"].clone())
    layer.weight_scale_2 = p(q["weight_scale_2"].reshape(1).clone())
    layer.input_scale = p(input_scale.reshape(1).clone())
    layer.output_size_per_partition = q["weight"].shape[0]
    layer.input_size_per_partition = q["weight"].shape[1] * 2
    return layer


def verify_shape(n: int, k: int, device, ms: Sequence[int] = CHECK_MS) -> Outcome:
    """Run the backend on a synthetic N x K weight at each M of `ms` against the reference (GPU)."""
    import torch

    from sglang.sm120 import fp4_layer
    from sglang.sm120 import nvfp4 as F
    from sglang.sm120.fp4_tolerance import compare, exact_dequant, reference_gemm

    t0 = time.perf_counter()
    rows = checked_rows(n, k)
    fault = fault_site() == "gemm"
    device = torch.device(device)

    def outcome(ok, **kw):
        return Outcome(ok, n, k, rows, tuple(ms), time.perf_counter() - t0, **kw)

    path, m = "setup", None
    try:
        g = torch.Generator(device=device).manual_seed(n * 31 + k)
        w = torch.randn(rows, k, device=device, generator=g) * 0.02
        q = F.quantize_weight_modelopt(w)
        wd = exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
        x = torch.randn(max(ms), k, device=device, generator=g).to(torch.bfloat16)
        in_s = F.input_scale_from_amax(x.float().abs().max())
        layer = _synthetic_layer(q, in_s)
        fp4_layer.repack(layer)
        for i, m in enumerate(ms):
            xm = x[:m]
            if fp4_layer.uses_w4a16(m):
                path = "W4A16"
                xd = xm.float()
            else:
                path = "W4A4"
                xd = exact_dequant(*F.quantize_nvfp4(xm, 1.0 / in_s), in_s)
            y = fp4_layer.apply(layer, xm)
            if fault and i == 0:
                y = corrupt_one(y)
            c = compare(y, *reference_gemm(xd, wd))
            if not c.ok:
                return outcome(False, m=m, path=path, error=c.summary())
        torch.cuda.synchronize(device)
    except Exception as exc:  # a launch error, a missing kernel image, ...
        return outcome(False, m=m, path=path, error=error_line(exc))
    return outcome(True)


def fall_back_to_upstream(reason: str) -> str:
    """Switch this process's NVFP4 GEMM backend to upstream's automatic choice; its name."""
    from sglang.sm120 import fp4_backend
    from sglang.srt.layers.quantization import fp4_utils

    fp4_backend.disable_sm120(reason)
    fp4_backend.initialize_upstream_config("auto")
    return fp4_utils.get_fp4_gemm_runner_backend().value


_check = OnceCheck("NVFP4", "FP4 GEMM", logger)


def outcome() -> Optional[Outcome]:
    """This process's self-check result (None before the first NVFP4 layer)."""
    return _check.outcome


def ensure_verified(n: int, k: int, device, *, verify: Optional[Callable[..., Outcome]] = None,
                    fall_back: Optional[Callable[[str], str]] = None) -> Outcome:
    """The first call runs `verify` (default verify_shape) for (N, K) on `device`, logs one line
    and, on failure, falls back (default fall_back_to_upstream); every later call returns that
    first outcome (selfcheck.OnceCheck)."""
    verify = verify or verify_shape
    return _check.ensure(lambda: verify(n, k, device), fall_back or fall_back_to_upstream)


def reset_for_tests() -> None:
    _check.reset()
