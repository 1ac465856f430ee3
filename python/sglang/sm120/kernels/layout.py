"""Weight layout of the sm120 NVFP4 GEMMs (pure PyTorch; CPU or CUDA; the reference packer).

A ModelOpt NVFP4 weight [N, K/2] (two e2m1 a byte, low nibble first) plus its e4m3 block scales
[N, K/16] becomes:

* ``qweight``: uint8 [N_pad * K_pad / 2] (N_pad = N rounded up to 128, K_pad = K rounded up to 64),
  a sequence of 512-byte tiles ordered [group of 128 rows][row tile 0..7][K chunk of 64]. Tile
  ``rt`` holds 16 MMA rows; MMA row r is the group's row ``32*a + 4*rt + b`` with
  ``a = 2*((r>>2)&1) + (r>>3)``, ``b = r&3`` (so the tile's scales are 64 contiguous bytes of the
  swizzled scale layout and rows r, r+8 own adjacent scale words). Inside a tile, lane
  ``L = 4*g + t`` owns 16 bytes = 4 words: (row g, K 8t..8t+7), (row g+8, same K),
  (row g, K 32+8t..), (row g+8, same K) -- exactly the A-operand registers of the MMA.
* Each word holds 8 e2m1 values with their bits permuted (``ENC_BITS``) so the W4A16 kernel turns
  every bf16 pair into place with one or two rotate+mask operations and the W4A4 kernel reaches
  plain nibbles (in ``P_ORDER``) with four.
* ``scales``: float8_e4m3fn [N_pad, K_pad/16] in the 128x4 swizzled layout (docs/kernels.md).

Blocks whose scale is 0 get all-zero codes (the kernels map a zero scale to a nonzero constant and
rely on zero codes). Negative or NaN block scales are rejected.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang.sm120 import nvfp4

# Bit positions of {mantissa, exp0, exp1, sign} of value k (K offset 0..7 of an 8-group) in a
# packed word. Derived from the decode masks in csrc/common.cuh (decode_pair0..3).
ENC_BITS = (
    (6, 7, 8, 15), (22, 23, 24, 31),    # pair 0: word & 0x81C081C0
    (10, 11, 12, 19), (26, 27, 28, 3),  # pair 1: rotr(word, 4) & 0x81C081C0
    (16, 17, 18, 25), (0, 1, 2, 9),     # pair 2: rotr(word, 10) & 0x81C081C0
    (20, 13, 14, 21), (4, 29, 30, 5),   # pair 3: rotr(w,6) & 0x81808180 | rotr(w,14) & 0x00400040
)
# Nibble position of value k in the plain order consumed by the block-scaled FP4 MMA ("P order").
P_ORDER = (1, 5, 2, 6, 4, 0, 3, 7)
# to_p_order(w) = OR over (rotl(w, d) & mask) -- csrc/common.cuh
TO_P_TERMS = ((0, 0x60076007), (24, 0x18801880), (26, 0x80088008), (30, 0x07700770))

GROUP_ROWS = 128
CHUNK_K = 64


@dataclass
class PackedWeight:
    """An NVFP4 linear weight in the kernel layout. weight_scale_2 is the DECODE global scale."""

    qweight: torch.Tensor        # uint8 [n_pad * k_pad / 2]
    scales: torch.Tensor         # float8_e4m3fn [n_pad, k_pad / 16], 128x4 swizzled
    weight_scale_2: torch.Tensor  # float32 [1]
    n: int
    k: int

    @property
    def n_pad(self) -> int:
        return _round_up(self.n, GROUP_ROWS)

    @property
    def k_pad(self) -> int:
        return _round_up(self.k, CHUNK_K)


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def tile_row_to_actual(rt: int, r: int) -> int:
    a = 2 * ((r >> 2) & 1) + (r >> 3)
    return 32 * a + 4 * rt + (r & 3)


def _row_order(n_pad: int, device) -> torch.Tensor:
    """Actual row of (group, row tile, MMA row), flattened in that order."""
    local = torch.tensor([tile_row_to_actual(rt, r) for rt in range(8) for r in range(16)],
                         dtype=torch.long, device=device)
    groups = torch.arange(n_pad // GROUP_ROWS, dtype=torch.long, device=device) * GROUP_ROWS
    return (groups[:, None] + local[None, :]).reshape(-1)


def encode_words(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., 8] (values k = 0..7) -> int32 [...] packed words (ENC_BITS).
    int32 (not int64) and one value slice at a time: packing a 150M-value weight on the GPU must
    not need gigabytes of temporaries."""
    word = torch.zeros(codes.shape[:-1], dtype=torch.int32, device=codes.device)
    for k, bits in enumerate(ENC_BITS):
        ck = codes[..., k].to(torch.int32)
        for i, pos in enumerate(bits):
            word |= ((ck >> i) & 1) << pos  # bit 31: wraps to the sign bit, as intended
    return word


def decode_words(words: torch.Tensor) -> torch.Tensor:
    """Inverse of encode_words: int64 [...] -> uint8 codes [..., 8]."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros(w.shape + (8,), dtype=torch.int64, device=w.device)
    for k, bits in enumerate(ENC_BITS):
        for i, pos in enumerate(bits):
            out[..., k] |= ((w >> pos) & 1) << i
    return out.to(torch.uint8)


def p_order_words(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., 8] -> int64 [...] plain nibble words in P order."""
    c = codes.to(torch.int64)
    word = torch.zeros(codes.shape[:-1], dtype=torch.int64, device=codes.device)
    for k, pos in enumerate(P_ORDER):
        word |= (c[..., k] & 0xF) << (4 * pos)
    return word


def p_order_packed(packed: torch.Tensor) -> torch.Tensor:
    """Natural packed e2m1 [M, K/2] -> the same values in P order (what quantize(mma_order=True)
    writes). K must be a multiple of 16."""
    m, half_k = packed.shape
    codes = nvfp4.unpack_e2m1(packed).reshape(m, half_k // 4, 8)
    words = p_order_words(codes)
    b = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return b.to(torch.uint8).reshape(m, half_k)


def _check_scale_bytes(raw: torch.Tensor) -> None:
    if bool((raw == 0x7F).any()) or bool((raw == 0xFF).any()):
        raise ValueError("weight_scale contains NaN block scales")
    if bool((raw > 0x7F).any()):
        raise ValueError("weight_scale contains negative block scales; NVFP4 block scales must be >= 0")


def pack_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2) -> PackedWeight:
    """ModelOpt NVFP4 weight -> PackedWeight (same device as `weight`).

    weight: uint8 [N, K/2]; weight_scale: float8_e4m3fn (or uint8 bytes) [N, K/16] row-major;
    weight_scale_2: DECODE global scale (float or 1-element tensor). N and K must be multiples of 16.
    """
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.uint8 or weight.dim() != 2:
        raise TypeError("weight must be a 2-D uint8 tensor [N, K/2] (two e2m1 values a byte)")
    n, half_k = weight.shape
    k = 2 * half_k
    if n % 16 or k % 16:
        raise ValueError(f"weight: N (= {n}) and K (= {k}) must be multiples of 16")
    if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError("weight_scale must be a float8_e4m3fn (or uint8) tensor [N, K/16]")
    if tuple(weight_scale.shape) != (n, k // 16):
        raise ValueError(f"weight_scale must have shape {(n, k // 16)} for weight {tuple(weight.shape)}, "
                         f"got {tuple(weight_scale.shape)}")
    if weight_scale.device != weight.device:
        raise ValueError(f"weight_scale is on {weight_scale.device}, weight on {weight.device}")
    ws2 = torch.as_tensor(weight_scale_2, dtype=torch.float32).detach().reshape(-1)
    if ws2.numel() != 1:
        raise ValueError(f"weight_scale_2 must hold one value, got {ws2.numel()} (take the max of fused partitions first)")
    if not bool(torch.isfinite(ws2).all()) or float(ws2) <= 0:
        raise ValueError(f"weight_scale_2 must be finite and > 0, got {float(ws2)}")
    raw = weight_scale.contiguous().view(torch.uint8)
    _check_scale_bytes(raw)

    dev = weight.device
    n_pad, k_pad = _round_up(n, GROUP_ROWS), _round_up(k, CHUNK_K)
    codes = torch.zeros((n_pad, k_pad), dtype=torch.uint8, device=dev)
    codes[:n, :k] = nvfp4.unpack_e2m1(weight.contiguous())
    zero_blocks = torch.zeros((n_pad, k_pad // 16), dtype=torch.bool, device=dev)
    zero_blocks[:n, : k // 16] = raw == 0
    codes.view(n_pad, k_pad // 16, 16).masked_fill_(zero_blocks[..., None], 0)

    words = encode_words(codes.view(n_pad, k_pad // 8, 8))          # [n_pad, k_pad/8]
    chunks = k_pad // CHUNK_K
    tiles = words.view(n_pad, chunks, 8)[_row_order(n_pad, dev)]    # [(G, rt, r), C, 8]
    tiles = tiles.view(n_pad // GROUP_ROWS, 8, 2, 8, chunks, 2, 4)  # G, rt, rh, g, C, qh, t
    tiles = tiles.permute(0, 1, 4, 3, 6, 5, 2).contiguous()          # G, rt, C, g, t, qh, rh
    qweight = tiles.reshape(-1).view(torch.uint8)  # little-endian words -> bytes, no copy

    padded_scales = torch.zeros((n_pad, k_pad // 16), dtype=torch.uint8, device=dev)
    padded_scales[:n, : k // 16] = raw
    scales = nvfp4.swizzle_scales(padded_scales).view(torch.float8_e4m3fn)
    return PackedWeight(qweight=qweight, scales=scales, weight_scale_2=ws2.to(dev).clone(), n=n, k=k)


def unpack_weight(pw: PackedWeight) -> tuple:
    """PackedWeight -> (weight uint8 [N, K/2], weight_scale float8_e4m3fn [N, K/16]) -- the inverse of
    pack_weight up to the zeroed codes of zero-scale blocks. For tests."""
    n_pad, k_pad = pw.n_pad, pw.k_pad
    chunks = k_pad // CHUNK_K
    flat = pw.qweight.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    tiles = flat.view(n_pad // GROUP_ROWS, 8, chunks, 8, 4, 2, 2).permute(0, 1, 6, 3, 2, 5, 4)
    words_by_tile_row = tiles.reshape(n_pad, chunks * 8)
    words = torch.empty_like(words_by_tile_row)  # int64
    words[_row_order(n_pad, words.device)] = words_by_tile_row
    codes = decode_words(words).reshape(n_pad, k_pad)[: pw.n, : pw.k]
    weight = nvfp4.pack_e2m1(codes)
    scales = nvfp4.unswizzle_scales(pw.scales, n_pad, k_pad)[: pw.n, : pw.k // 16]
    return weight, scales.contiguous()
