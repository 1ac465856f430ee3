"""The pure-PyTorch NVFP4 reference (sglang.sm120.nvfp4) against the format description."""
import math

import pytest
import torch

from sglang.sm120 import nvfp4 as F

pytestmark = pytest.mark.base_independent

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _codes(vals):
    return F.float_to_e2m1_codes(torch.tensor(vals, dtype=torch.float32)).tolist()


def test_grid_values_are_exact():
    codes = _codes(GRID + [-v for v in GRID[1:]])
    assert codes == list(range(8)) + list(range(9, 16))
    back = F.e2m1_codes_to_float(torch.arange(16, dtype=torch.uint8)).tolist()
    assert back == GRID + [-0.0] + [-v for v in GRID[1:]]


def test_ties_round_to_even_code():
    # midpoints between neighbours: the tie goes to the code with an even index
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert _codes(ties) == [0, 2, 2, 4, 4, 6, 6]
    assert _codes([-t for t in ties]) == [8, 10, 10, 12, 12, 14, 14]
    # just off the tie goes to the nearer neighbour
    eps = 1e-4
    assert _codes([t + eps for t in ties]) == [1, 2, 3, 4, 5, 6, 7]
    assert _codes([t - eps for t in ties]) == [0, 1, 2, 3, 4, 5, 6]


def test_saturation_and_signed_zero():
    assert _codes([6.0, 6.5, 100.0, math.inf, -7.0, -math.inf]) == [7, 7, 7, 7, 15, 15]
    assert _codes([-0.0, -0.2, 0.2]) == [8, 8, 0]


def test_packing_low_nibble_first():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 0.5, -6.0   # codes 1 and 15
    x[0, 2], x[0, 3] = 6.0, 1.0    # codes 7 and 2
    # amax 6 and global scale 448 -> block scale exactly 448, values unchanged
    packed, scales = F.quantize_nvfp4(x, 448.0)
    assert scales.to(torch.float32).item() == 448.0
    assert packed[0, 0].item() == 0x1 | (0xF << 4)
    assert packed[0, 1].item() == 0x7 | (0x2 << 4)
    unpacked = F.unpack_e2m1(packed)
    assert unpacked[0, :4].tolist() == [1, 15, 7, 2]


def test_block_scale_formula():
    torch.manual_seed(0)
    x = torch.randn(4, 64) * 10
    gs = 123.0
    packed, scales = F.quantize_nvfp4(x, gs)
    amax = x.reshape(4, 4, 16).abs().amax(-1)
    expect = torch.clamp((amax / 6) * torch.tensor(gs), max=448).to(torch.float8_e4m3fn)
    assert torch.equal(scales.view(torch.uint8), expect.view(torch.uint8))
    # values are the RNE e2m1 of x * gs / scale
    inv = torch.tensor(gs) / scales.to(torch.float32)
    q = x.reshape(4, 4, 16) * inv.unsqueeze(-1)
    assert torch.equal(F.unpack_e2m1(packed), F.float_to_e2m1_codes(q).reshape(4, 64))


def test_scale_saturates_at_448():
    x = torch.full((1, 16), 1000.0)
    packed, scales = F.quantize_nvfp4(x, 448.0)  # wants scale 1000*448/6 >> 448
    assert scales.view(torch.uint8).item() == 0x7E  # 448
    assert F.unpack_e2m1(packed).unique().tolist() == [7]


def test_zero_block_is_zero_not_nan():
    x = torch.zeros(2, 32)
    x[1, 16:] = torch.linspace(-1, 1, 16)
    x[0, :16] = -0.0
    packed, scales = F.quantize_nvfp4(x, 100.0)
    assert scales.view(torch.uint8)[:, 0].tolist() == [0, 0]
    d = F.dequantize_nvfp4(packed, scales, 100.0)
    assert torch.all(d[:, :16] == 0) and not torch.isnan(d).any()
    # underflow: the block scale rounds to 0 in e4m3 -> treated as a zero block
    tiny = torch.full((1, 16), 1e-9)
    p, s = F.quantize_nvfp4(tiny, 1.0)
    assert s.view(torch.uint8).item() == 0 and torch.all(p == 0)


def test_nan_poisons_its_block_only():
    x = torch.randn(1, 48)
    x[0, 20] = float("nan")
    packed, scales = F.quantize_nvfp4(x, 200.0)
    assert scales.view(torch.uint8)[0].tolist()[1] == 0x7F
    assert torch.all(F.unpack_e2m1(packed)[0, 16:32] == 0)
    d = F.dequantize_nvfp4(packed, scales, 200.0)
    assert torch.isnan(d[0, 16:32]).all()
    assert torch.isfinite(d[0, :16]).all() and torch.isfinite(d[0, 32:]).all()


def test_inf_saturates_and_stays_finite():
    x = torch.randn(1, 32) * 0.1
    x[0, 3] = float("inf")
    x[0, 4] = float("-inf")
    packed, scales = F.quantize_nvfp4(x, 50.0)
    assert scales.view(torch.uint8)[0, 0].item() == 0x7E
    codes = F.unpack_e2m1(packed)[0]
    assert codes[3].item() == 7 and codes[4].item() == 15
    d = F.dequantize_nvfp4(packed, scales, 50.0)
    assert torch.isfinite(d).all()
    assert d[0, 3].item() == pytest.approx(6 * 448 / 50.0)


def test_swizzle_formula_at_coordinates():
    m, k = 300, 16 * 10  # M not a multiple of 128, K/16 not a multiple of 4
    s = torch.arange(m * k // 16, dtype=torch.int64).reshape(m, k // 16)
    s = (s % 251 + 1).to(torch.uint8)
    sw = F.swizzle_scales(s)
    mp, kbp = F.padded_scale_shape(m, k)
    assert tuple(sw.shape) == (mp, kbp) == (384, 12)
    flat = sw.reshape(-1)
    n_k_tiles = kbp // 4
    for (r, c) in [(0, 0), (1, 0), (31, 3), (32, 0), (33, 5), (127, 9), (128, 0), (299, 9),
                   (200, 4), (97, 2)]:
        off = (r // 128) * (n_k_tiles * 512) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert off == F.swizzled_scale_offset(r, c, n_k_tiles)
        assert flat[off].item() == s[r, c].item(), (r, c)
    # padding is zero
    assert int(sw.reshape(-1).to(torch.int64).sum()) == int(s.to(torch.int64).sum())


def test_swizzle_round_trip_fp8():
    torch.manual_seed(1)
    for m, k in [(1, 16), (5, 64), (128, 256), (129, 2048), (1000, 6144)]:
        x = torch.randn(m, k)
        _, s = F.quantize_nvfp4(x, 448 * 6 / 4.0)
        sw = F.swizzle_scales(s)
        assert sw.dtype == torch.float8_e4m3fn
        back = F.unswizzle_scales(sw, m, k)
        assert torch.equal(back.view(torch.uint8), s.view(torch.uint8))
        # flat 1-D input is accepted as well
        back1 = F.unswizzle_scales(sw.reshape(-1), m, k)
        assert torch.equal(back1.view(torch.uint8), s.view(torch.uint8))


def test_round_trip_error_bound():
    # Gaussian data, per-tensor global scale from amax. The e2m1 grid has relative step <= 1/3
    # (between 1.5 and 2), so RMS relative error of a Gaussian block is ~0.1; bound it at 0.12.
    torch.manual_seed(2)
    x = torch.randn(256, 1024, dtype=torch.bfloat16)
    gs = 448 * 6 / x.float().abs().max().item()
    packed, scales = F.quantize_nvfp4(x, gs)
    d = F.dequantize_nvfp4(packed, scales, gs)
    rel = ((d - x.float()).norm() / x.float().norm()).item()
    assert 0.03 < rel < 0.12, rel
    # every element is within half a grid step of its block: |err| <= scale * 1 (gap 4->6 is 2)
    blk_scale = scales.to(torch.float32).repeat_interleave(16, dim=1) / gs
    assert torch.all((d - x.float()).abs() <= blk_scale * 1.0 + 1e-6)


def test_dtypes_agree_and_devices():
    torch.manual_seed(3)
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    a = F.quantize_nvfp4(x, 300.0)
    b = F.quantize_nvfp4(x.float(), 300.0)
    c = F.quantize_nvfp4(x.float(), torch.tensor([300.0]))
    for t in (b, c):
        assert torch.equal(a[0], t[0]) and torch.equal(a[1].view(torch.uint8), t[1].view(torch.uint8))


def test_modelopt_weight_round_trip():
    torch.manual_seed(4)
    w = torch.randn(64, 256, dtype=torch.bfloat16) * 0.02
    q = F.quantize_weight_modelopt(w)
    assert q["weight"].dtype == torch.uint8 and tuple(q["weight"].shape) == (64, 128)
    assert q["weight_scale"].dtype == torch.float8_e4m3fn and tuple(q["weight_scale"].shape) == (64, 16)
    assert q["weight_scale_2"].dtype == torch.float32 and q["weight_scale_2"].dim() == 0
    amax = w.float().abs().max().item()
    assert q["weight_scale_2"].item() == pytest.approx(amax / (6 * 448), rel=1e-6)
    d = F.dequantize_weight_modelopt(q["weight"], q["weight_scale"], q["weight_scale_2"])
    assert ((d - w.float()).norm() / w.float().norm()).item() < 0.12
    # shared weight_scale_2 (fused layers) is honoured
    shared = F.quantize_weight_modelopt(w, weight_scale_2=q["weight_scale_2"] * 2)
    assert shared["weight_scale_2"].item() == pytest.approx(q["weight_scale_2"].item() * 2)
    d2 = F.dequantize_weight_modelopt(shared["weight"], shared["weight_scale"], shared["weight_scale_2"])
    assert ((d2 - w.float()).norm() / w.float().norm()).item() < 0.12
    # all-zero weight
    z = F.quantize_weight_modelopt(torch.zeros(16, 32))
    assert torch.all(F.dequantize_weight_modelopt(z["weight"], z["weight_scale"], z["weight_scale_2"]) == 0)


def test_input_scale_from_amax():
    s = F.input_scale_from_amax(2688.0)
    assert s.dtype == torch.float32 and s.dim() == 0 and s.item() == 1.0
    assert F.input_scale_from_amax(torch.tensor(5.0)).item() == pytest.approx(5 / 2688)


def test_gemm_references_agree_with_dense():
    torch.manual_seed(5)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    w = torch.randn(32, 256) * 0.05
    q = F.quantize_weight_modelopt(w)
    wd = F.dequantize_weight_modelopt(q["weight"], q["weight_scale"], q["weight_scale_2"])
    y16 = F.gemm_w4a16_reference(x, q["weight"], q["weight_scale"], q["weight_scale_2"])
    assert torch.allclose(y16, x.float() @ wd.t(), rtol=1e-5, atol=1e-5)
    in_s = F.input_scale_from_amax(x.float().abs().max())
    y4 = F.gemm_w4a4_reference(x, in_s, q["weight"], q["weight_scale"], q["weight_scale_2"])
    rel = ((y4 - y16).norm() / y16.norm()).item()
    assert rel < 0.15, rel


@pytest.mark.parametrize("call, exc, word", [
    (lambda: F.quantize_nvfp4(torch.randn(4, 24), 1.0), ValueError, "x"),
    (lambda: F.quantize_nvfp4(torch.randn(64), 1.0), ValueError, "x"),
    (lambda: F.quantize_nvfp4(torch.randn(4, 32).to(torch.int32), 1.0), TypeError, "x"),
    (lambda: F.quantize_nvfp4([[1.0] * 16], 1.0), TypeError, "x"),
    (lambda: F.quantize_nvfp4(torch.randn(4, 32), 0.0), ValueError, "global_scale"),
    (lambda: F.quantize_nvfp4(torch.randn(4, 32), float("inf")), ValueError, "global_scale"),
    (lambda: F.quantize_nvfp4(torch.randn(4, 32), torch.ones(2)), ValueError, "global_scale"),
    (lambda: F.quantize_nvfp4(torch.randn(4, 32), "1"), TypeError, "global_scale"),
    (lambda: F.dequantize_nvfp4(torch.zeros(4, 16, dtype=torch.uint8),
                                torch.zeros(4, 1, dtype=torch.uint8), 1.0), ValueError, "scales"),
    (lambda: F.dequantize_nvfp4(torch.zeros(4, 16), torch.zeros(4, 2, dtype=torch.uint8), 1.0),
     TypeError, "packed"),
    (lambda: F.unswizzle_scales(torch.zeros(128, 4, dtype=torch.uint8), 129, 64), ValueError, "swizzled"),
    (lambda: F.unswizzle_scales(torch.zeros(128, 4, dtype=torch.uint8), 100, 60), ValueError, "k"),
    (lambda: F.quantize_weight_modelopt(torch.randn(8, 32), weight_scale_2=-1.0), ValueError,
     "weight_scale_2"),
    (lambda: F.dequantize_weight_modelopt(torch.zeros(8, 16, dtype=torch.uint8),
                                          torch.zeros(8, 3, dtype=torch.uint8), 1.0), ValueError,
     "weight_scale"),
])
def test_bad_input_names_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


# ----------------------------------------------------------------------------- kernel layout model
# A bit-level software model of what the CUDA kernels do with the packed layout (the same rotate /
# mask constants, scale-word offsets, byte selectors and MMA fragment maps as csrc/), checked
# against the reference GEMMs. It cannot catch CUDA transcription errors (the GPU tests do), but it
# proves the layout, the decode constants and the fragment bookkeeping are right, on any machine.
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from sglang.sm120.kernels import layout as L  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
M32 = 0xFFFFFFFF


def _rotr(w, s):
    return ((w >> s) | (w << (32 - s))) & M32


def _rotl(w, s):
    return _rotr(w, (32 - s) % 32)


def _decode_pair(w, j):
    if j == 0:
        return w & 0x81C081C0
    if j == 1:
        return _rotr(w, 4) & 0x81C081C0
    if j == 2:
        return _rotr(w, 10) & 0x81C081C0
    return (_rotr(w, 6) & 0x81808180) | (_rotr(w, 14) & 0x00400040)


def _to_p_order(w):
    out = np.zeros_like(w)
    for d, mask in L.TO_P_TERMS:
        out |= _rotl(w, d) & mask if d else w & mask
    return out


def _bf16_halves(w):
    """uint32 bf16x2 -> (lo, hi) float32."""
    lo = ((w & 0xFFFF) << 16).astype(np.uint32).view(np.float32)
    hi = (w & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return lo, hi


def _e4m3_f(b):
    return torch.tensor(np.asarray(b, dtype=np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def _scale_x2p118(two_bytes):
    """csrc e4m3x2_to_bf16x2_x2p118: cvt.rn.f16x2.e4m3x2, (h >> 3) + 0x73007300."""
    lo = _e4m3_f(two_bytes & 0xFF).astype(np.float16).view(np.uint16).astype(np.int64)
    hi = _e4m3_f((two_bytes >> 8) & 0xFF).astype(np.float16).view(np.uint16).astype(np.int64)
    h = lo | (hi << 16)
    return ((h >> 3) + 0x73007300) & M32


def _byte(w, i):
    return (w >> (8 * i)) & 0xFF


def test_layout_constants_match_csrc():
    src = (REPO / "csrc" / "common.cuh").read_text()
    for d, mask in L.TO_P_TERMS:
        assert f"0x{mask:08X}u" in src.replace("0x0770", "0x0770"), hex(mask)
    perm = re.search(r"p_order_nibble\(int k\) \{\s*return (.*?);", src, re.S).group(1)
    got = [int(v) for v in re.findall(r"\? (\d)", perm)] + [int(re.findall(r": (\d)$", perm.strip())[0])]
    assert tuple(got) == L.P_ORDER


def test_word_decode_formulas():
    # every code in every position: encode, then the kernel's rotate/mask gives e2m1 * 2^-126
    rng = np.random.default_rng(0)
    codes = torch.tensor(rng.integers(0, 16, size=(4096, 8)), dtype=torch.uint8)
    codes[:16, 0] = torch.arange(16, dtype=torch.uint8)
    words = L.encode_words(codes).numpy().astype(np.int64) & M32
    assert torch.equal(L.decode_words(torch.tensor(words)), codes)
    vals = F.e2m1_codes_to_float(codes).numpy()
    for j in range(4):
        lo, hi = _bf16_halves(_decode_pair(words, j))
        np.testing.assert_array_equal(lo * np.float32(2.0 ** 126), vals[:, 2 * j])
        np.testing.assert_array_equal(hi * np.float32(2.0 ** 126), vals[:, 2 * j + 1])
    # to_p_order gives plain nibbles in P order
    pw = _to_p_order(words)
    np.testing.assert_array_equal(pw, L.p_order_words(codes).numpy())


def test_scale_conversion_exact_for_all_e4m3():
    b = np.arange(0x7F, dtype=np.int64)  # every non-negative finite e4m3 (0x7F is NaN)
    pair = _scale_x2p118(b | (b[::-1] << 8))
    lo, hi = _bf16_halves(pair)
    want_lo, want_hi = _e4m3_f(b), _e4m3_f(b[::-1])
    nz = want_lo != 0
    np.testing.assert_array_equal(lo[nz], (want_lo[nz].astype(np.float64) * 2.0 ** 118).astype(np.float32))
    nz = want_hi != 0
    np.testing.assert_array_equal(hi[nz], (want_hi[nz].astype(np.float64) * 2.0 ** 118).astype(np.float32))


def _packed_words(pw):
    return pw.qweight.numpy().view(np.uint32).astype(np.int64)  # little-endian words


def _model_w4a16(pw, x):
    """Simulate gemm_w4a16 warp by warp. x float32 [M, K] (bf16 values)."""
    m, k = x.shape
    n_chunks = pw.k_pad // 64
    xp = np.zeros((m, pw.k_pad), np.float32)
    xp[:, :k] = x
    words = _packed_words(pw)
    sc = pw.scales.view(torch.uint8).numpy().reshape(-1).astype(np.int64)
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    tb = t >> 1
    y = np.zeros((m, pw.n_pad), np.float64)
    for grp in range(pw.n_pad // 128):
        for rt in range(8):
            acc = np.zeros((16, m), np.float64)
            for c in range(n_chunks):
                base = ((grp * 8 + rt) * n_chunks + c) * 128
                w = words[base: base + 128].reshape(32, 4)
                soff = grp * n_chunks * 512 + c * 512 + rt * 64 + (g & 3) * 16 + (g >> 2) * 8
                scx = sum(sc[soff + i] << (8 * i) for i in range(4))
                scy = sum(sc[soff + 4 + i] << (8 * i) for i in range(4))
                # __byte_perm(scx, scy, tb | (4+tb)<<4 | (2+tb)<<8 | (6+tb)<<12)
                sb = _byte(scx, tb) | (_byte(scy, tb) << 8) | (_byte(scx, 2 + tb) << 16) | (_byte(scy, 2 + tb) << 24)
                s_lo, s_hi = _scale_x2p118(sb & 0xFFFF), _scale_x2p118(sb >> 16)
                # MMA (h, s): K half h, pairs 2s / 2s+1 of the words of rows g and g+8 (a0, a1 / a2, a3),
                # B from X at K 32h + 8t + 4s .. + 3 (two adjacent words of one X load)
                for h, s in ((0, 0), (0, 1), (1, 0), (1, 1)):
                    a = np.zeros((16, 16), np.float64)
                    sh = (s_lo, s_hi)[h]
                    regs = [(w[:, 2 * h], sh, 0, 2 * s), (w[:, 2 * h + 1], sh, 1, 2 * s),
                            (w[:, 2 * h], sh, 0, 2 * s + 1), (w[:, 2 * h + 1], sh, 1, 2 * s + 1)]
                    frag = []
                    for wi, s_w, which, j in regs:
                        lo, hi = _bf16_halves(_decode_pair(wi, j))
                        sv = _bf16_halves(s_w)[which]
                        plo, phi = lo.astype(np.float64) * sv, hi.astype(np.float64) * sv
                        # HMUL2 result must be exact in bf16
                        for p in (plo, phi):
                            assert np.array_equal(p.astype(np.float32).view(np.uint32) & 0xFFFF, np.zeros_like(p, np.uint32))
                        frag.append((plo, phi))
                    a[g, 2 * t], a[g, 2 * t + 1] = frag[0]
                    a[g + 8, 2 * t], a[g + 8, 2 * t + 1] = frag[1]
                    a[g, 2 * t + 8], a[g, 2 * t + 9] = frag[2]
                    a[g + 8, 2 * t + 8], a[g + 8, 2 * t + 9] = frag[3]
                    for mt in range((m + 7) // 8):
                        b = np.zeros((16, 8), np.float64)
                        for gg in range(8):
                            tok = mt * 8 + gg
                            if tok >= m:
                                continue
                            for tt in range(4):
                                k0 = 64 * c + 32 * h + 8 * tt + 4 * s
                                b[2 * tt, gg], b[2 * tt + 1, gg] = xp[tok, k0], xp[tok, k0 + 1]
                                b[2 * tt + 8, gg], b[2 * tt + 9, gg] = xp[tok, k0 + 2], xp[tok, k0 + 3]
                        res = a @ b
                        cols = [mt * 8 + gg for gg in range(8) if mt * 8 + gg < m]
                        acc[:, cols] += res[:, : len(cols)]
            for r in range(16):
                y[:, grp * 128 + L.tile_row_to_actual(rt, r)] = acc[r]
    alpha = float(pw.weight_scale_2) * 256.0
    return (y * alpha)[:, : pw.n]


def _model_w4a4(pw, xq_p, xs_sw, m, alpha, emulate):
    """Simulate gemm_w4a4: the PTX m16n8k64 block-scale semantics (emulate=False) or the bf16
    emulation's decode of the same registers (emulate=True)."""
    n_chunks = pw.k_pad // 64
    words = _packed_words(pw)
    wsc = pw.scales.view(torch.uint8).numpy().reshape(-1).astype(np.int64)
    xsc = xs_sw.view(torch.uint8).numpy().reshape(-1).astype(np.int64)
    xb = np.zeros((((m + 127) // 128) * 128, pw.k_pad // 2), np.int64)
    xb[:m, : xq_p.shape[1]] = xq_p.numpy()
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    e2m1 = F.e2m1_codes_to_float(torch.arange(16, dtype=torch.uint8)).numpy().astype(np.float64)

    def u32(rows, off):
        return sum(xb[rows, off + i] << (8 * i) for i in range(4))

    y = np.zeros((xb.shape[0], pw.n_pad), np.float64)
    for grp in range(pw.n_pad // 128):
        for mb in range(xb.shape[0] // 128):
            for rt in range(8):
                acc = np.zeros((16, 128), np.float64)
                for c in range(n_chunks):
                    base = ((grp * 8 + rt) * n_chunks + c) * 128
                    a = [_to_p_order(words[base: base + 128].reshape(32, 4)[:, i]) for i in range(4)]
                    sfa = sum(wsc[grp * n_chunks * 512 + c * 512 + rt * 64 + (g & 3) * 16
                                  + (2 * (g >> 2) + (lanes & 1)) * 4 + i] << (8 * i) for i in range(4))
                    for nt in range(16):
                        tok = mb * 128 + 8 * nt + g
                        b0 = u32(tok, 32 * c + 4 * t)
                        b1 = u32(tok, 32 * c + 16 + 4 * t)
                        ml = 8 * nt + g
                        sfb = sum(xsc[mb * n_chunks * 512 + c * 512 + (ml % 32) * 16 + (ml // 32) * 4 + i] << (8 * i)
                                  for i in range(4))
                        if not emulate:
                            A = np.zeros((16, 64)); B = np.zeros((64, 8)); SA = np.zeros((16, 4)); SB = np.zeros((8, 4))
                            for ln in range(32):
                                gg, tt = ln >> 2, ln & 3
                                for i in range(8):
                                    A[gg, 8 * tt + i] = e2m1[(a[0][ln] >> (4 * i)) & 15]
                                    A[gg + 8, 8 * tt + i] = e2m1[(a[1][ln] >> (4 * i)) & 15]
                                    A[gg, 32 + 8 * tt + i] = e2m1[(a[2][ln] >> (4 * i)) & 15]
                                    A[gg + 8, 32 + 8 * tt + i] = e2m1[(a[3][ln] >> (4 * i)) & 15]
                                    B[8 * tt + i, gg] = e2m1[(b0[ln] >> (4 * i)) & 15]
                                    B[32 + 8 * tt + i, gg] = e2m1[(b1[ln] >> (4 * i)) & 15]
                                if tt < 2:  # thread-id-a = 0: lanes t=0,1 give rows g, g+8
                                    SA[gg + 8 * (ln & 1)] = _e4m3_f([_byte(sfa[ln], i) for i in range(4)])
                                if tt == 0:
                                    SB[gg] = _e4m3_f([_byte(sfb[ln], i) for i in range(4)])
                            As = A * np.repeat(SA, 16, axis=1)
                            Bs = B * np.repeat(SB, 16, axis=1).T
                            acc[:, 8 * nt: 8 * nt + 8] += As @ Bs
                        else:
                            other = sfa[lanes ^ 1]
                            sa_g = np.where(lanes & 1, other, sfa)
                            sa_g8 = np.where(lanes & 1, sfa, other)
                            lo, hi = t >> 1, 2 + (t >> 1)
                            sc = {k: _e4m3_f(_byte(v, blk)).astype(np.float64) for k, v, blk in
                                  (("glo", sa_g, lo), ("ghi", sa_g, hi), ("g8lo", sa_g8, lo), ("g8hi", sa_g8, hi),
                                   ("blo", sfb, lo), ("bhi", sfb, hi))}

                            def pair(wd, j, s):
                                return (e2m1[(wd >> (4 * L.P_ORDER[2 * j])) & 15] * s,
                                        e2m1[(wd >> (4 * L.P_ORDER[2 * j + 1])) & 15] * s)
                            for j in range(4):
                                A = np.zeros((16, 16)); B = np.zeros((16, 8))
                                A[g, 2 * t], A[g, 2 * t + 1] = pair(a[0], j, sc["glo"])
                                A[g + 8, 2 * t], A[g + 8, 2 * t + 1] = pair(a[1], j, sc["g8lo"])
                                A[g, 2 * t + 8], A[g, 2 * t + 9] = pair(a[2], j, sc["ghi"])
                                A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9] = pair(a[3], j, sc["g8hi"])
                                B[2 * t, g], B[2 * t + 1, g] = pair(b0, j, sc["blo"])
                                B[2 * t + 8, g], B[2 * t + 9, g] = pair(b1, j, sc["bhi"])
                                acc[:, 8 * nt: 8 * nt + 8] += A @ B
                for r in range(16):
                    y[mb * 128: mb * 128 + 128, grp * 128 + L.tile_row_to_actual(rt, r)] = acc[r]
    return (y * alpha)[:m, : pw.n]


def _exact_dequant(packed, scales, decode_scale):
    """float64 dequantization with no intermediate rounding."""
    vals = F.e2m1_codes_to_float(F.unpack_e2m1(packed)).double()
    sf = scales.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=1)
    return vals * sf * float(decode_scale)


def _random_case(n, k, m, seed):
    torch.manual_seed(seed)
    w = torch.randn(n, k) * 0.05
    w[3, 16:32] = 0.0  # a zero-scale block
    q = F.quantize_weight_modelopt(w)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    return q, x


def test_model_w4a16_matches_reference():
    q, x = _random_case(144, 160, 10, 7)  # N, K not multiples of 128 / 64; M not a multiple of 8
    pw = L.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    want = (x.double() @ wd.t()).numpy()  # float64: equal up to summation order
    got = _model_w4a16(pw, x.float().numpy())
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("emulate", [False, True])
def test_model_w4a4_matches_reference(emulate):
    q, x = _random_case(128, 96, 5, 8)  # K = 96: a half chunk of padding
    pw = L.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    in_s = F.input_scale_from_amax(x.float().abs().max())
    packed, scales = F.quantize_nvfp4(x, 1.0 / in_s)
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    xd = _exact_dequant(packed, scales, in_s)
    want = (xd @ wd.t()).numpy()
    got = _model_w4a4(pw, L.p_order_packed(packed), F.swizzle_scales(scales), x.shape[0],
                      float(in_s) * float(q["weight_scale_2"]), emulate)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
