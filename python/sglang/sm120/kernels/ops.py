"""Thin, validated Python API over the NVFP4 kernels.

Every call checks dtype, shape, divisibility, contiguity and device before anything reaches the
GPU (TypeError / ValueError naming the argument), launches on torch's current stream of the
tensors' device, never synchronizes the host and never allocates device memory except the outputs
(optional `out=`) and a per-(device, stream) split-K workspace created on first use -- so the calls
are CUDA-graph capturable.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional, Tuple

import torch

from .. import settings
from . import _lib
from .layout import PackedWeight

_BF16 = torch.bfloat16
# Process-wide defaults of the launch options, from the environment (sglang.sm120.settings); an
# explicit argument of the ops below wins over them.
# Workspace: partials (SGLANG_SM120_WORKSPACE_MB) + the fixed 256 KB split-K ticket region at the
# front (kW4A16TicketRegionBytes in csrc/kernels.h).
_WORKSPACE_BYTES = int(settings.number("SGLANG_SM120_WORKSPACE_MB") * (1 << 20)) + (256 << 10)
# Debug mode: synchronize after every launch and name the kernel and sizes of a device fault
# (otherwise it surfaces at some later, unrelated torch call). Not for production or graph capture.
_SYNC_AFTER_LAUNCH = settings.switch("SGLANG_SM120_KERNEL_SYNC")
# Programmatic dependent launch of the W4A16 GEMM (its weight prefetch overlaps the previous
# kernel's tail) and between the grouped MoE's own kernels; SGLANG_SM120_PDL=0 launches them as
# plain kernels.
PDL_DEFAULT = settings.switch("SGLANG_SM120_PDL")
# Split-K reduced inside a thread-block cluster (<= 8 splits; no workspace round trip through L2)
# instead of by the last CTA of each tile; SGLANG_SM120_W4A16_CLUSTER=1 makes it the default.
CLUSTER_DEFAULT = settings.switch("SGLANG_SM120_W4A16_CLUSTER")
_FLAG_PDL, _FLAG_CLUSTER, _FLAG_EIGHT_WARPS = 1, 2, 4  # kW4A16Pdl, ...ClusterReduce, ...EightWarps (kernels.h)
_FLAG_WARPK, _FLAG_SPLITK, _FLAG_AUTO_WARPS = 8, 16, 32  # kW4A16WarpK, kW4A16SplitK, kW4A16AutoWarps
_W4A16_WARPS = (4, 8)
# Which W4A16 kernel runs: "warpk" (one CTA per 16-row tile, K split over its 8 warps; M <= 16),
# "split" (128-row CTAs, split-K across CTAs) or "auto" (csrc's default_w4a16_warpk rule).
_W4A16_KERNEL_FLAGS = {"auto": 0, "warpk": _FLAG_WARPK, "split": _FLAG_SPLITK}
WARPK_MAX_M = 16  # kW4A16WarpKMaxM


def _kernel(value, name: str) -> str:
    if value not in _W4A16_KERNEL_FLAGS:
        raise ValueError(f"{name} must be one of {sorted(_W4A16_KERNEL_FLAGS)} (the W4A16 GEMM kernel), got {value!r}")
    return value


KERNEL_DEFAULT = settings.choice("SGLANG_SM120_W4A16_KERNEL")


def _warps(value, name: str, auto: bool = False):
    """4 or 8 (or "auto" where `auto`), else a ValueError naming `name`."""
    if auto and value == "auto":
        return "auto"
    try:
        warps = int(value)
    except (TypeError, ValueError):
        warps = None
    if warps not in _W4A16_WARPS:
        what = "4, 8 or auto" if auto else "4 or 8"
        raise ValueError(f"{name} must be {what} (warps per 128-row CTA of the W4A16 GEMM), got {value!r}")
    return warps


# Warps per 128-row CTA of the W4A16 GEMM: 4 (two 16-row tiles each) or 8 (one each; twice the
# warps per SM for the same grid, the same bits). The default, "auto": 8 for the 16-token M tile
# (9 <= M <= 16) unless the split-K grid has more than 3 CTAs per SM, 4 otherwise; the plan decides
# (csrc/kernels.h, w4a16_eight_warps): 8 warps are faster at the 16-token tile except on a split-K
# grid already denser than 3 CTAs per SM, where they are slower (docs/kernels.md).
# SGLANG_SM120_W4A16_WARPS=4, 8 or auto sets the default.
WARPS_DEFAULT = _warps(settings.choice("SGLANG_SM120_W4A16_WARPS"), "SGLANG_SM120_W4A16_WARPS", auto=True)


def _warps_flag(warps) -> int:
    """The plan/launch flag of a warp setting: `warps` if given, else the default."""
    setting = WARPS_DEFAULT if warps is None else _warps(warps, "warps")
    return _FLAG_AUTO_WARPS if setting == "auto" else _FLAG_EIGHT_WARPS if setting == 8 else 0


def w4a16_warps(m: int, n: int, k: int, sm_count: int, warps: Optional[int] = None, split_target: int = 0) -> int:
    """The warps per CTA the split-K kernel runs a W4A16 call with (M, N, K on sm_count SMs): `warps`
    if given, else the default (SGLANG_SM120_W4A16_WARPS; "auto": 8 at 9 <= M <= 16 where the
    split-K grid has at most 3 CTAs per SM, else 4). Host only."""
    return w4a16_plan(m, n, k, sm_count, split_target=split_target, kernel="split", warps=warps)["warps"]


_ws_lock = threading.Lock()
_workspaces: dict = {}


# ----------------------------------------------------------------------------- validation

def _tensor(name: str, t, dtype=None, dim: Optional[int] = None, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must be {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got device {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device} (all arguments on one device)")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous())")
    return t


def _aligned(name: str, t: torch.Tensor, bytes_: int = 16) -> None:
    if t.data_ptr() % bytes_:
        raise ValueError(f"{name} must start on a {bytes_}-byte boundary (got a view at an odd offset; "
                         "pass a fresh or .clone()d tensor)")


def _scalar(name: str, t, device) -> torch.Tensor:
    _tensor(name, t, torch.float32, device=device)
    if t.numel() != 1:
        raise ValueError(f"{name} must hold exactly one fp32 value, got shape {tuple(t.shape)}")
    return t


def _out(name: str, out, shape, dtype, device) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _tensor(name, out, dtype, device=device)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    _aligned(name, out)
    return out


def _ptr(t: Optional[torch.Tensor]):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _stream(device: torch.device):
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def workspace(device: torch.device) -> torch.Tensor:
    """Zero-initialised split-K workspace of the current stream of `device` (created once)."""
    stream = torch.cuda.current_stream(device).cuda_stream
    key = (device.index, stream)
    ws = _workspaces.get(key)
    if ws is None:
        with _ws_lock:
            ws = _workspaces.get(key)
            if ws is None:
                ws = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
                _workspaces[key] = ws
    return ws


def _sync_after(sync: Optional[bool]) -> bool:
    """Whether a launch synchronizes after itself: `sync` if given, else SGLANG_SM120_KERNEL_SYNC."""
    return _SYNC_AFTER_LAUNCH if sync is None else bool(sync)


def _debug_sync(device: torch.device, what: str) -> None:
    """Sync-after-launch mode (callers test _sync_after first, so the message `what` is only
    formatted then): synchronize and name the launch that faulted."""
    if torch.cuda.is_current_stream_capturing():
        return
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # the context is dead after a device fault: report what ran last
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"{what} faulted on the device: {first}") from exc


def packed_scale_shape(m: int, k: int) -> Tuple[int, int]:
    return ((m + 127) // 128 * 128, (k // 16 + 3) // 4 * 4)


# ----------------------------------------------------------------------------- ops

def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, *, mma_order: bool = False,
                   out: Optional[torch.Tensor] = None, out_scales: Optional[torch.Tensor] = None,
                   sync: Optional[bool] = None):
    """bf16 x [M, K] -> (packed uint8 [M, K/2], scales float8_e4m3fn [M_pad128, K/16 pad 4] swizzled).

    global_scale: fp32 1-element CUDA tensor, the ENCODE scale (1 / input_scale). Bit-exact with
    sglang.sm120.nvfp4.quantize_nvfp4 (then swizzle_scales). mma_order=True writes the nibble order
    the W4A4 GEMM consumes (layout.p_order_packed of the plain result). sync: synchronize after
    the launch and name it if it faulted (None: $SGLANG_SM120_KERNEL_SYNC, default off; debugging
    only, skipped while a graph is captured).
    """
    _tensor("x", x, _BF16, dim=2)
    dev = x.device
    m, k = x.shape
    if k % 16:
        raise ValueError(f"x: K (= {k}) must be a multiple of 16")
    if m == 0:
        raise ValueError("x: M must be > 0")
    _aligned("x", x)
    _scalar("global_scale", global_scale, dev)
    packed = _out("out", out, (m, k // 2), torch.uint8, dev)
    if out_scales is None:
        scales = torch.empty(packed_scale_shape(m, k), dtype=torch.float8_e4m3fn, device=dev)
    else:
        scales = _out("out_scales", out_scales, packed_scale_shape(m, k), (torch.float8_e4m3fn, torch.uint8), dev)
    _launch_quantize(x, global_scale, packed, scales, bool(mma_order), sync)
    return packed, scales


def _launch_quantize(x, global_scale, packed, scales, mma_order: bool, sync: Optional[bool] = None) -> None:
    dev = x.device
    m, k = x.shape
    rc = _lib.load().sm120_quantize_nvfp4(dev.index, _ptr(x), _ptr(global_scale), _ptr(packed), _ptr(scales),
                                          m, k, int(mma_order), _stream(dev))
    _lib.check(rc, "quantize_nvfp4")
    if _sync_after(sync):  # the message is only built in debug mode (eager decode calls this per GEMM)
        _debug_sync(dev, f"quantize_nvfp4(M={m}, K={k}, mma_order={mma_order})")


def _check_weight(weight: PackedWeight, dev) -> None:
    if not isinstance(weight, PackedWeight):
        raise TypeError(f"weight must be a PackedWeight (from pack_weight), got {type(weight).__name__}")
    _tensor("weight.qweight", weight.qweight, torch.uint8, device=dev)
    _tensor("weight.scales", weight.scales, (torch.float8_e4m3fn, torch.uint8), device=dev)
    _scalar("weight.weight_scale_2", weight.weight_scale_2, dev)
    if weight.qweight.numel() != weight.n_pad * weight.k_pad // 2:
        raise ValueError(f"weight.qweight has {weight.qweight.numel()} bytes, expected "
                         f"{weight.n_pad * weight.k_pad // 2} for N={weight.n}, K={weight.k}")
    if weight.scales.numel() != weight.n_pad * weight.k_pad // 16:
        raise ValueError(f"weight.scales has {weight.scales.numel()} bytes, expected {weight.n_pad * weight.k_pad // 16}")
    _aligned("weight.qweight", weight.qweight)
    _aligned("weight.scales", weight.scales)


def _check_bias(bias, n: int, dev):
    if bias is None:
        return None
    _tensor("bias", bias, _BF16, dim=1, device=dev)
    if bias.shape[0] != n:
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    return bias


def gemm_w4a16(x: torch.Tensor, weight: PackedWeight, *, bias: Optional[torch.Tensor] = None,
               out: Optional[torch.Tensor] = None, workspace_buf: Optional[torch.Tensor] = None,
               split_target: int = 0, pdl: Optional[bool] = None,
               cluster: Optional[bool] = None, warps: Optional[int] = None,
               kernel: Optional[str] = None, sync: Optional[bool] = None) -> torch.Tensor:
    """y bf16 [M, N] = x bf16 [M, K] . dequant(weight)^T (+ bias), fp32 accumulation.

    workspace_buf: optional zero-initialised uint8 CUDA buffer owned by the caller's stream
    (default: a cached one per device and stream). split_target: CTAs to aim for (0 = the default: no split
    when the output tiles fill 3/4 of the SMs, or a third of them with K <= 512; else 2 per SM for
    weights of >= 8 MB (4 from 32 MB), else 1 per SM at M <= 16 and 1 per 2 SMs above; csrc/kernels.h);
    a target of at most one CTA per SM takes the most splits whose grid still fits the SMs.
    pdl: programmatic dependent launch (None: $SGLANG_SM120_PDL, default on).
    cluster: reduce up to 8 splits inside a thread-block cluster (None:
    $SGLANG_SM120_W4A16_CLUSTER, default off); more splits still go through the workspace.
    Both reductions sum in the same order: the results are bit-identical.
    warps: 4 or 8 per 128-row CTA of the split-K kernel (None: $SGLANG_SM120_W4A16_WARPS, default
    auto: the plan picks, w4a16_warps);
    the same bits.
    kernel: "auto", "split" or "warpk" (None: $SGLANG_SM120_W4A16_KERNEL, default auto). "warpk"
    (M <= 16) runs one CTA per 16-row weight tile with K split over its warps: no split-K
    hand-off, different summation order (within the same tolerance, not the same bits). With
    "auto", a nonzero split_target selects the split-K kernel.
    sync: as quantize_nvfp4's.
    """
    if warps is not None:
        _warps(warps, "warps")  # a bad count is refused before the tensors are looked at
    if kernel is not None:
        _kernel(kernel, "kernel")
    _tensor("x", x, _BF16, dim=2)
    dev = x.device
    _check_weight(weight, dev)
    m, k = x.shape
    if k != weight.k:
        raise ValueError(f"x: K (= {k}) does not match the weight's K (= {weight.k})")
    if m == 0:
        raise ValueError("x: M must be > 0")
    if kernel == "warpk" and m > WARPK_MAX_M:
        raise ValueError(f"kernel='warpk' serves M <= {WARPK_MAX_M}, x has M = {m}")
    _aligned("x", x)
    bias = _check_bias(bias, weight.n, dev)
    y = _out("out", out, (m, weight.n), _BF16, dev)
    if workspace_buf is None:
        workspace_buf = workspace(dev)
    else:
        _tensor("workspace_buf", workspace_buf, torch.uint8, device=dev)
        _aligned("workspace_buf", workspace_buf)
    _launch_w4a16(x, weight, bias, y, workspace_buf, int(split_target), PDL_DEFAULT if pdl is None else bool(pdl),
                  CLUSTER_DEFAULT if cluster is None else bool(cluster), warps, kernel, sync)
    return y


def _launch_w4a16(x, weight: PackedWeight, bias, y, workspace_buf, split_target: int = 0,
                  pdl: bool = PDL_DEFAULT, cluster: bool = CLUSTER_DEFAULT, warps: Optional[int] = None,
                  kernel: Optional[str] = None, sync: Optional[bool] = None) -> None:
    dev = x.device
    if kernel is None:
        kernel = KERNEL_DEFAULT
        if kernel == "warpk" and x.shape[0] > WARPK_MAX_M:
            kernel = "split"  # SGLANG_SM120_W4A16_KERNEL=warpk covers the calls it can serve
    flags = ((_FLAG_PDL if pdl else 0) | (_FLAG_CLUSTER if cluster else 0) | _warps_flag(warps)
             | _W4A16_KERNEL_FLAGS[kernel])
    rc = _lib.load().sm120_gemm_w4a16(dev.index, _ptr(x), _ptr(weight.qweight), _ptr(weight.scales),
                                      _ptr(weight.weight_scale_2), _ptr(bias), _ptr(y), x.shape[0], weight.n,
                                      weight.k, _ptr(workspace_buf), workspace_buf.numel(), split_target,
                                      flags, _stream(dev))
    _lib.check(rc, "gemm_w4a16")
    if _sync_after(sync):
        _debug_sync(dev, f"gemm_w4a16(M={x.shape[0]}, N={weight.n}, K={weight.k}, split_target={split_target}, "
                         f"pdl={pdl}, cluster={cluster}, warps={WARPS_DEFAULT if warps is None else warps}, "
                         f"kernel={kernel})")


_W4A4_MODES = {"auto": 0, "hardware": 1, "emulate": 2}


def gemm_w4a4(xq: torch.Tensor, x_scales: torch.Tensor, input_scale: torch.Tensor, weight: PackedWeight,
              *, bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
              mode: str = "auto", sync: Optional[bool] = None) -> torch.Tensor:
    """y bf16 [M, N] = (xq . Wq^T) * input_scale * weight_scale_2 (+ bias).

    xq, x_scales: from quantize_nvfp4(x, 1 / input_scale, mma_order=True). mode: "auto" (the
    block-scaled FP4 MMA on SM120, its emulation elsewhere), "hardware" (SM120 only) or "emulate".
    sync: as quantize_nvfp4's.
    """
    _tensor("xq", xq, torch.uint8, dim=2)
    dev = xq.device
    _check_weight(weight, dev)
    m, half_k = xq.shape
    if 2 * half_k != weight.k:
        raise ValueError(f"xq: K (= {2 * half_k}) does not match the weight's K (= {weight.k})")
    if weight.k % 32:
        raise ValueError(f"weight: K (= {weight.k}) must be a multiple of 32 for the W4A4 GEMM")
    if m == 0:
        raise ValueError("xq: M must be > 0")
    _tensor("x_scales", x_scales, (torch.float8_e4m3fn, torch.uint8), device=dev)
    if tuple(x_scales.shape) != packed_scale_shape(m, weight.k):
        raise ValueError(f"x_scales must have shape {packed_scale_shape(m, weight.k)} (swizzled), "
                         f"got {tuple(x_scales.shape)}")
    _scalar("input_scale", input_scale, dev)
    if mode not in _W4A4_MODES:
        raise ValueError(f"mode must be one of {sorted(_W4A4_MODES)}, got {mode!r}")
    for name, t in (("xq", xq), ("x_scales", x_scales)):
        _aligned(name, t)
    bias = _check_bias(bias, weight.n, dev)
    y = _out("out", out, (m, weight.n), _BF16, dev)
    _launch_w4a4(xq, x_scales, input_scale, weight, bias, y, _W4A4_MODES[mode], sync)
    return y


def _launch_w4a4(xq, x_scales, input_scale, weight: PackedWeight, bias, y, mode: int = 0,
                 sync: Optional[bool] = None) -> None:
    dev = xq.device
    rc = _lib.load().sm120_gemm_w4a4(dev.index, _ptr(xq), _ptr(x_scales), _ptr(input_scale), _ptr(weight.qweight),
                                     _ptr(weight.scales), _ptr(weight.weight_scale_2), _ptr(bias), _ptr(y),
                                     xq.shape[0], weight.n, weight.k, mode, _stream(dev))
    _lib.check(rc, "gemm_w4a4")
    if _sync_after(sync):
        _debug_sync(dev, f"gemm_w4a4(M={xq.shape[0]}, N={weight.n}, K={weight.k}, mode={mode})")


# ----------------------------------------------------------------------------- layer fast path
# fp4_linear validates the packed weight and scalars once at load time; per call only the
# activation and bias are checked here (cheap attribute tests), which keeps eager decode steps from
# paying ~20 checks per GEMM. The C layer re-checks sizes and alignment, so a slip still raises.

def check_activation(x, k: int, bias, n: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != _BF16 or x.dim() != 2 or not x.is_cuda:
        raise TypeError(f"x must be a 2-D bf16 CUDA tensor, got "
                        f"{type(x).__name__ if not isinstance(x, torch.Tensor) else (x.dtype, tuple(x.shape), x.device)}")
    if x.shape[1] != k:
        raise ValueError(f"x: K (= {x.shape[1]}) does not match the layer's K (= {k})")
    if not x.is_contiguous() or x.data_ptr() % 16:
        raise ValueError("x must be contiguous and 16-byte aligned")
    if bias is not None and (bias.dtype != _BF16 or bias.numel() != n or not bias.is_contiguous()
                             or bias.device != x.device):
        raise ValueError(f"bias must be a contiguous bf16 [{n}] tensor on {x.device}")


def layer_w4a16(x, weight: PackedWeight, bias) -> torch.Tensor:
    y = torch.empty((x.shape[0], weight.n), dtype=_BF16, device=x.device)
    _launch_w4a16(x, weight, bias, y, workspace(x.device))
    return y


def layer_w4a4(x, input_scale, input_scale_inv, weight: PackedWeight, bias) -> torch.Tensor:
    m, k = x.shape
    dev = x.device
    xq = torch.empty((m, k // 2), dtype=torch.uint8, device=dev)
    xs = torch.empty(packed_scale_shape(m, k), dtype=torch.float8_e4m3fn, device=dev)
    _launch_quantize(x, input_scale_inv, xq, xs, True)
    y = torch.empty((m, weight.n), dtype=_BF16, device=dev)
    _launch_w4a4(xq, xs, input_scale, weight, bias, y, 0)
    return y


def w4a16_plan(m: int, n: int, k: int, sm_count: int, workspace_bytes: int = _WORKSPACE_BYTES,
               split_target: int = 0, cluster: bool = False, kernel: str = "auto", warps=None) -> dict:
    """The split-K plan the W4A16 GEMM would use and its workspace layout (host only; for tests
    and benchmarks). Tickets (one int per tile z * n_ctas + x) occupy the first
    ticket_region_bytes for every plan; partial slot (tile, split) starts at
    partial_offset + (tile * splits + split) * partial_tile_bytes. cluster: as gemm_w4a16's;
    "cluster" in the result says whether this plan reduces in a cluster (then it uses no
    workspace). kernel: as gemm_w4a16's; "warpk" in the result says which kernel the plan runs
    (then n_ctas counts 16-row tiles, splits the CTAs of a cluster per tile and warpk_warps the
    warps per CTA); otherwise "warps" is the split-K kernel's warps per CTA (warps: as gemm_w4a16's)."""
    lib = _lib.load()
    flags = (_FLAG_CLUSTER if cluster else 0) | _W4A16_KERNEL_FLAGS[_kernel(kernel, "kernel")] | _warps_flag(warps)
    out = (ctypes.c_int * 9)()
    need = ctypes.c_size_t(0)
    _lib.check(lib.sm120_w4a16_plan(m, n, k, sm_count, workspace_bytes, split_target, flags, out,
                                    ctypes.byref(need)), "w4a16_plan")
    lay = (ctypes.c_size_t * 4)()
    _lib.check(lib.sm120_w4a16_workspace_layout(m, n, k, sm_count, workspace_bytes, split_target, flags, lay),
               "w4a16_workspace_layout")
    return {"m_tiles": out[0], "m_blocks": out[1], "n_ctas": out[2], "splits": out[3],
            "chunks_per_split": out[4], "cluster": bool(out[5]), "split_target": out[6], "warpk": bool(out[7]),
            "warpk_warps": out[7], "warps": out[8],
            "workspace_bytes": need.value,
            "ticket_region_bytes": lay[0], "partial_offset": lay[1], "partial_tile_bytes": lay[2]}
