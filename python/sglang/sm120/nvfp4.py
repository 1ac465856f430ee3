"""Pure-PyTorch reference of the NVFP4 format (CPU or CUDA tensors).

Written from the format description (docs/kernels.md, "Format conventions"); it is the oracle
the CUDA kernels are tested against (bit-exact for quantization, tolerance for GEMMs) and the
fallback where no kernel exists.

Format
------
* e2m1 values: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; code = sign<<3 | magnitude index (0..7).
* Two codes per byte, LOW nibble first: byte j of a row holds elements 2j (bits 0-3) and 2j+1
  (bits 4-7).
* One float8_e4m3fn block scale per 16 consecutive K elements, one fp32 global scale per tensor.
* Kernels read block scales in the 128x4 swizzled layout (see `swizzle_scales`).

Scale conventions
-----------------
* `global_scale` given to `quantize_nvfp4` / `dequantize_nvfp4` is the ENCODE scale
  (448 * 6 / amax, as FlashInfer's fp4_quantize): x ~= e2m1 * block_scale / global_scale.
* ModelOpt checkpoints store the DECODE scale `weight_scale_2` = amax / (6 * 448) and
  `input_scale` = amax / (6 * 448); encode scale = 1 / decode scale.

Quantization, exactly (every step is one IEEE fp32 operation, round-to-nearest-even, so the CUDA
kernels reproduce it bit for bit; never compile them with fast-math):
    amax = max |x| over the 16-element block (x converted to fp32 exactly)
    s    = (amax / 6) * global_scale
    sf   = e4m3(min(s, 448))                    # RNE, saturating at 448
    inv  = global_scale / float(sf), or 0 when sf == 0
    q    = x * inv
    code = e2m1(q)                              # RNE, saturating at +-6, sign kept (-0 -> 0x8)
e2m1 rounding, |q| -> magnitude: ties go to the even code, i.e. 0.25->0, 0.75->1, 1.25->1,
1.75->2, 2.5->2, 3.5->4, 5->4; anything above 5 (including +-inf) -> 6.

Special values (the CUDA quantize kernel implements the same rules):
* Zero block (amax == 0, or (amax/6)*global_scale rounds to 0 in e4m3): scale byte 0x00 and every
  value code 0 (+0) or 0x8 (-0 for negative inputs) -- dequantizes to exact zeros, never NaN.
* +-Inf (no NaN in the block): amax = inf, scale saturates to 448 (0x7E); the inf element
  becomes +-6 (saturated) and the rest of the block is quantized against scale 448. Inf never
  propagates: the block dequantizes to finite values.
* NaN anywhere in a block: scale byte 0x7F (e4m3 NaN) and every value code of that block 0, so the
  whole 16-element block dequantizes to NaN. NaN is propagated per block, never hidden.
* global_scale must be finite and > 0 (ValueError here; the kernels do not check a device scalar).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

__all__ = [
    "E2M1_VALUES",
    "FP4_MAX",
    "E4M3_MAX",
    "BLOCK",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "swizzle_scales",
    "unswizzle_scales",
    "swizzled_scale_offset",
    "padded_scale_shape",
    "quantize_weight_modelopt",
    "dequantize_weight_modelopt",
    "input_scale_from_amax",
    "float_to_e2m1_codes",
    "e2m1_codes_to_float",
    "pack_e2m1",
    "unpack_e2m1",
    "gemm_w4a16_reference",
    "gemm_w4a4_reference",
]

BLOCK = 16
FP4_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even boundaries: '>' where the tie goes down (to the even code below),
# '>=' where it goes up (to the even code above).
_E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                (2.5, False), (3.5, True), (5.0, False))

Scalar = Union[float, int, torch.Tensor]


# ----------------------------------------------------------------------------- validation

def _check_matrix(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [rows, cols], got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def _scalar_f32(name: str, v: Scalar, device: torch.device, positive: bool = True) -> torch.Tensor:
    """Return v as a 0-d fp32 tensor on `device`; it must be one finite (positive) number."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError(f"{name} must hold exactly one value, got shape {tuple(v.shape)}")
        if not (v.dtype.is_floating_point or v.dtype in (torch.int32, torch.int64)):
            raise TypeError(f"{name} must be a floating-point scalar, got {v.dtype}")
        t = v.detach().reshape(()).to(device=device, dtype=torch.float32)
    elif isinstance(v, (float, int)) and not isinstance(v, bool):
        t = torch.tensor(float(v), dtype=torch.float32, device=device)
    else:
        raise TypeError(f"{name} must be a float or a 1-element tensor, got {type(v).__name__}")
    val = float(t)  # reference code: a host sync is acceptable here
    if not math.isfinite(val) or (positive and val <= 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {val}")
    return t


# ----------------------------------------------------------------------------- e2m1 codes

def float_to_e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """fp32 -> e2m1 codes (uint8, 0..15): RNE, saturating at +-6, sign bit kept (-0 -> 8).

    NaN maps to code 0 here; quantize_nvfp4 handles NaN blocks before calling this.
    """
    a = q.abs()
    mag = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for bound, inclusive in _E2M1_BOUNDS:
        mag += (a >= bound if inclusive else a > bound).to(torch.uint8)
    sign = torch.signbit(q) & ~torch.isnan(q)
    return mag | (sign.to(torch.uint8) << 3)


def e2m1_codes_to_float(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) -> fp32 values."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32,
                       device=codes.device)
    return lut[codes.long() & 0xF]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, low nibble = even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes last dim must be even, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes (uint8)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


# ----------------------------------------------------------------------------- quantize

def _e4m3_satfinite(s: torch.Tensor) -> torch.Tensor:
    # torch's fp32->e4m3fn cast is RNE but maps |x| >= 480 to NaN; clamp first (NaN stays NaN).
    return torch.clamp(s, max=E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_nvfp4(x: torch.Tensor, global_scale: Scalar):
    """Quantize x [M, K] (bf16/fp16/fp32) to NVFP4.

    global_scale is the ENCODE scale (448*6/amax). Returns (packed uint8 [M, K/2],
    scales float8_e4m3fn [M, K/16]) with scales in the plain row-major layout (see
    `swizzle_scales` for the kernel layout). Rules for zeros/NaN/Inf: see the module docstring.
    """
    _check_matrix("x", x, (torch.bfloat16, torch.float16, torch.float32))
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"x: K (= {k}) must be a multiple of {BLOCK}")
    gs = _scalar_f32("global_scale", global_scale, x.device)

    xb = x.to(torch.float32).reshape(m, k // BLOCK, BLOCK)
    has_nan = torch.isnan(xb).any(dim=-1, keepdim=True)
    amax = torch.nan_to_num(xb, nan=0.0).abs().amax(dim=-1, keepdim=True)
    # Full-shape operands everywhere: torch may replace division by a scalar with multiplication
    # by its reciprocal, which is not bit-exact.
    gs_full = gs.expand_as(amax).contiguous()
    s = (amax / torch.full_like(amax, FP4_MAX)) * gs_full
    sf = _e4m3_satfinite(s)
    sf_f = sf.to(torch.float32)
    inv = torch.where(sf_f == 0, torch.zeros_like(sf_f), gs_full / sf_f)
    q = xb * inv
    codes = float_to_e2m1_codes(q)
    codes = torch.where(has_nan, torch.zeros_like(codes), codes)
    nan_byte = torch.full_like(sf.view(torch.uint8), 0x7F)
    sf = torch.where(has_nan, nan_byte, sf.view(torch.uint8)).view(torch.float8_e4m3fn)
    packed = pack_e2m1(codes.reshape(m, k))
    return packed.contiguous(), sf.reshape(m, k // BLOCK).contiguous()


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, global_scale: Scalar) -> torch.Tensor:
    """Inverse of quantize_nvfp4: float32 [M, K] = e2m1 * float(scale) / global_scale (ENCODE)."""
    _check_matrix("packed", packed, (torch.uint8,))
    _check_matrix("scales", scales, (torch.float8_e4m3fn, torch.uint8))
    m, half_k = packed.shape
    k = half_k * 2
    if k % BLOCK:
        raise ValueError(f"packed: K (= {k}) must be a multiple of {BLOCK}")
    if tuple(scales.shape) != (m, k // BLOCK):
        raise ValueError(f"scales must have shape {(m, k // BLOCK)} (row-major, unswizzled), "
                         f"got {tuple(scales.shape)}")
    gs = _scalar_f32("global_scale", global_scale, packed.device)
    return _dequant(packed, scales, 1.0 / gs)


def _dequant(packed: torch.Tensor, scales: torch.Tensor, decode_scale: torch.Tensor) -> torch.Tensor:
    m = packed.shape[0]
    vals = e2m1_codes_to_float(unpack_e2m1(packed)).reshape(m, -1, BLOCK)
    sf = scales.view(torch.float8_e4m3fn).to(torch.float32).unsqueeze(-1)
    return (vals * (sf * decode_scale)).reshape(m, -1)


# ----------------------------------------------------------------------------- swizzle

def padded_scale_shape(m: int, k: int) -> tuple:
    """(rows, scale columns) of the swizzled layout for an [m, k] matrix: m padded to 128,
    k/16 padded to 4."""
    if k % BLOCK:
        raise ValueError(f"k (= {k}) must be a multiple of {BLOCK}")
    return ((m + 127) // 128 * 128, (k // BLOCK + 3) // 4 * 4)


def swizzled_scale_offset(m: int, kb: int, n_k_tiles: int) -> int:
    """Byte offset of the scale of row m, scale column kb (= k // 16) in the 128x4 layout."""
    return ((m // 128) * (n_k_tiles * 512) + (kb // 4) * 512 + (m % 32) * 16
            + ((m % 128) // 32) * 4 + kb % 4)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Row-major scales [M, K/16] -> 128x4 swizzled layout, same dtype, shape
    [M padded to 128, K/16 padded to 4] whose flat memory follows `swizzled_scale_offset`.
    Padding is zero."""
    _check_matrix("scales", scales, (torch.float8_e4m3fn, torch.uint8))
    m, kb = scales.shape
    mp, kbp = (m + 127) // 128 * 128, (kb + 3) // 4 * 4
    raw = scales.view(torch.uint8)
    padded = torch.zeros((mp, kbp), dtype=torch.uint8, device=scales.device)
    padded[:m, :kb] = raw
    # row = mt*128 + a*32 + b, col = kt*4 + c  ->  offset order (mt, kt, b, a, c)
    out = padded.reshape(mp // 128, 4, 32, kbp // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return out.reshape(mp, kbp).view(scales.dtype)


def unswizzle_scales(swizzled: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """Inverse of swizzle_scales for a matrix of m rows and k ELEMENTS along K (k/16 scale
    columns): returns row-major [m, k/16], padding dropped. Accepts any shape whose element
    count matches the padded layout."""
    if not isinstance(swizzled, torch.Tensor):
        raise TypeError(f"swizzled must be a torch.Tensor, got {type(swizzled).__name__}")
    if swizzled.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"swizzled must be float8_e4m3fn or uint8, got {swizzled.dtype}")
    if m <= 0 or k <= 0:
        raise ValueError(f"m and k must be positive, got m={m}, k={k}")
    mp, kbp = padded_scale_shape(m, k)
    if swizzled.numel() != mp * kbp:
        raise ValueError(f"swizzled has {swizzled.numel()} elements; an [m={m}, k={k}] matrix "
                         f"needs {mp}x{kbp} = {mp * kbp}")
    raw = swizzled.contiguous().view(torch.uint8).reshape(mp // 128, kbp // 4, 32, 4, 4)
    rows = raw.permute(0, 3, 2, 1, 4).reshape(mp, kbp)
    return rows[:m, : k // BLOCK].contiguous().view(swizzled.dtype)


# ----------------------------------------------------------------------------- ModelOpt

def input_scale_from_amax(amax: Scalar) -> torch.Tensor:
    """ModelOpt input_scale (DECODE global scale of an activation): amax / (6 * 448), fp32 0-d."""
    a = _scalar_f32("amax", amax, torch.device("cpu") if not isinstance(amax, torch.Tensor)
                    else amax.device)
    return (a / (FP4_MAX * E4M3_MAX)).to(torch.float32)


def quantize_weight_modelopt(w: torch.Tensor, weight_scale_2: Optional[Scalar] = None) -> dict:
    """Quantize a linear weight [N, K] the way a ModelOpt NVFP4 checkpoint stores it.

    weight_scale_2 is the DECODE global scale (amax / (6*448)); pass one to share it across fused
    layers (q/k/v, gate/up). Encode scale used = 1 / weight_scale_2. An all-zero weight gets
    weight_scale_2 = 1.0 (any positive value decodes the zeros exactly).
    Returns dict(weight=uint8 [N, K/2], weight_scale=float8_e4m3fn [N, K/16] row-major,
    weight_scale_2=float32 0-d).
    """
    _check_matrix("w", w, (torch.bfloat16, torch.float16, torch.float32))
    if weight_scale_2 is None:
        amax = torch.nan_to_num(w.detach().float(), nan=0.0).abs().max()
        if not torch.isfinite(amax):
            raise ValueError("w contains +-inf; pass an explicit weight_scale_2")
        ws2 = (amax / (FP4_MAX * E4M3_MAX)).to(torch.float32) if float(amax) > 0 else \
            torch.tensor(1.0, dtype=torch.float32, device=w.device)
    else:
        ws2 = _scalar_f32("weight_scale_2", weight_scale_2, w.device)
    gs = (torch.ones((), dtype=torch.float32, device=w.device) / ws2.to(w.device))
    if not math.isfinite(float(gs)):
        raise ValueError(f"weight_scale_2 (= {float(ws2)}) is too small: 1/weight_scale_2 overflows fp32")
    packed, sf = quantize_nvfp4(w, gs)
    return {"weight": packed, "weight_scale": sf, "weight_scale_2": ws2.reshape(()).clone()}


def dequantize_weight_modelopt(weight: torch.Tensor, weight_scale: torch.Tensor,
                               weight_scale_2: Scalar) -> torch.Tensor:
    """float32 [N, K] = e2m1 * float(weight_scale) * weight_scale_2 (DECODE scale)."""
    _check_matrix("weight", weight, (torch.uint8,))
    _check_matrix("weight_scale", weight_scale, (torch.float8_e4m3fn, torch.uint8))
    n, half_k = weight.shape
    if tuple(weight_scale.shape) != (n, half_k * 2 // BLOCK) or (half_k * 2) % BLOCK:
        raise ValueError(f"weight_scale must have shape {(n, half_k * 2 // BLOCK)} for weight "
                         f"{tuple(weight.shape)}, got {tuple(weight_scale.shape)}")
    ws2 = _scalar_f32("weight_scale_2", weight_scale_2, weight.device)
    return _dequant(weight, weight_scale, ws2)


# ----------------------------------------------------------------------------- GEMM references

def gemm_w4a16_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_scale_2: Scalar) -> torch.Tensor:
    """Y[M, N] (fp32) = x[M, K] . dequant(W)^T, fp32 accumulation (ModelOpt weight layout)."""
    _check_matrix("x", x, (torch.bfloat16, torch.float16, torch.float32))
    w = dequantize_weight_modelopt(weight, weight_scale, weight_scale_2)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x: K (= {x.shape[1]}) does not match weight K (= {w.shape[1]})")
    return x.to(torch.float32) @ w.t()


def gemm_w4a4_reference(x: torch.Tensor, input_scale: Scalar, weight: torch.Tensor,
                        weight_scale: torch.Tensor, weight_scale_2: Scalar) -> torch.Tensor:
    """Y[M, N] (fp32): x quantized to NVFP4 with encode scale 1/input_scale, times dequant(W)^T.
    This is the exact product of the quantized operands, accumulated in fp32."""
    _check_matrix("x", x, (torch.bfloat16, torch.float16, torch.float32))
    in_s = _scalar_f32("input_scale", input_scale, x.device)
    gs = torch.ones((), dtype=torch.float32, device=x.device) / in_s
    xq, xs = quantize_nvfp4(x, gs)
    xd = _dequant(xq, xs, in_s)
    w = dequantize_weight_modelopt(weight, weight_scale, weight_scale_2)
    if xd.shape[1] != w.shape[1]:
        raise ValueError(f"x: K (= {x.shape[1]}) does not match weight K (= {w.shape[1]})")
    return xd @ w.t()
