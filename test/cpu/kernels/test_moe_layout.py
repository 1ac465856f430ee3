"""The grouped W4A16 MoE's weight layout and arguments without a GPU.

The kernel (csrc/moe_w4a16.cu) finds expert e's 16-row tile `tile` at byte e * expert_bytes +
tile * chunks * 512 of the packed stack, reads MMA rows g and g + 8 of a gate_up tile as the gate
and the up row of output column 64 G + 32 ((g >> 2) & 1) + 4 rt + (g & 3), and MMA row r of a
down tile as hidden row 128 G + tile_row_to_actual(rt, r). An emulator that reads the packed bytes
with exactly that arithmetic must reproduce moe_reference from the ModelOpt tensors; a wrong
interleave, pad or expert stride gives O(1) errors here long before a GPU sees it.
"""
import pytest
import torch

from sglang.sm120 import nvfp4
from sglang.sm120.kernels import layout, moe

pytestmark = pytest.mark.base_independent


def _expert_matrix(stack_q, stack_s, e, n_pad, k):
    """Expert e's packed slice read at the kernel's expert stride -> dequantized [n_pad, k] fp32."""
    pw = layout.PackedWeight(qweight=stack_q[e], scales=stack_s[e], weight_scale_2=torch.ones(1), n=n_pad, k=k)
    w, s = layout.unpack_weight(pw)
    return nvfp4.dequantize_weight_modelopt(w, s, 1.0)


def _emulate(x, ids, weights, packed: moe.PackedExperts, scale):
    """The kernel's arithmetic in torch (fp32 per row, bf16 where the kernel stores)."""
    e_n, h, i = packed.num_experts, packed.hidden, packed.intermediate
    i_pad, h_pad = -(-i // 64) * 64, -(-h // 128) * 128
    t, topk = ids.shape
    per_slot = torch.zeros((t * topk, h), dtype=torch.float32)
    flat = ids.reshape(-1).long()
    for e in range(e_n):
        slots = (flat == e).nonzero().flatten()
        if slots.numel() == 0:
            continue
        xe = x[slots // topk].float()
        w13 = _expert_matrix(packed.w13, packed.w13_scales, e, 2 * i_pad, h)
        w2 = _expert_matrix(packed.w2, packed.w2_scales, e, h_pad, i)
        gate = torch.zeros((len(slots), i_pad))
        up = torch.zeros((len(slots), i_pad))
        for grp in range(2 * i_pad // 128):
            for rt in range(8):
                for g in range(8):
                    col = grp * 64 + 32 * ((g >> 2) & 1) + 4 * rt + (g & 3)
                    gate[:, col] = xe @ w13[grp * 128 + layout.tile_row_to_actual(rt, g)]
                    up[:, col] = xe @ w13[grp * 128 + layout.tile_row_to_actual(rt, g + 8)]
        a0, a1 = packed.w13_alpha[e].tolist()
        act = (torch.nn.functional.silu(gate * a0) * (up * a1)).to(torch.bfloat16).float()[:, :i]
        down = torch.zeros((len(slots), h_pad))
        for grp in range(h_pad // 128):
            for rt in range(8):
                for r in range(16):
                    row = grp * 128 + layout.tile_row_to_actual(rt, r)
                    down[:, row] = act @ w2[row]
        v = down[:, :h] * float(packed.w2_alpha[e]) * weights.reshape(-1)[slots][:, None]
        per_slot[slots] = v.to(torch.bfloat16).float()
    out = torch.zeros((t, h))
    for k in range(topk):
        valid = ((ids[:, k] >= 0) & (ids[:, k] < e_n)).float()[:, None]
        out += per_slot.view(t, topk, h)[:, k] * valid
    return (out * scale).to(torch.bfloat16)


@pytest.mark.parametrize("e,h,i", [(3, 128, 64), (4, 144, 80), (2, 64, 208)])
def test_packed_experts_read_the_kernels_way_give_the_reference(e, h, i):
    """I not a multiple of 64 (gate/up padding), H not a multiple of 128 (down row padding) or 64
    (a partial K chunk), and ids of other ranks' experts (-1, E) that must contribute nothing."""
    w = moe.synthetic_experts(e, h, i, "cpu", seed=e * h + i, std=0.5)
    packed = moe.pack_experts(**w)
    assert packed.w13.shape[0] == e and packed.w2.shape[0] == e
    g = torch.Generator().manual_seed(7)
    t, topk = 9, 2
    x = torch.randn((t, h), generator=g).to(torch.bfloat16)
    ids, weights = moe.synthetic_routing(t, topk, e, "cpu", seed=3)
    ids[0, 1], ids[4, 0] = -1, e  # experts of other ranks (EP)
    ref = moe.moe_reference(x, ids, weights, **w, routed_scaling_factor=2.5)
    emu = _emulate(x, ids, weights, packed, 2.5)
    assert bool(torch.isfinite(ref.float()).all()) and float(ref.float().abs().max()) > 0
    diff = (emu.float() - ref.float()).abs()
    # same math, other summation order: bf16 roundings may differ by an ulp or so, never more
    assert float(diff.max()) <= 0.02 * float(ref.float().abs().max()), diff.max()


def test_gate_up_rows_interleave_per_64_columns():
    # row r of the interleaved stack holds gate or up row (label) of column c: 1000 * (gate 1, up 2) + c
    i = 96
    label = torch.cat([1000 + torch.arange(i), 2000 + torch.arange(i)]).view(1, 2 * i, 1)
    out = moe.interleave_gate_up(label, i).flatten().tolist()
    assert len(out) == 256  # I padded to 128
    assert out[:32] == [1000 + c for c in range(32)] and out[32:64] == [2000 + c for c in range(32)]
    assert out[64:96] == [1032 + c for c in range(32)] and out[96:128] == [2032 + c for c in range(32)]
    assert out[128:160] == [1064 + c for c in range(32)] and out[160:192] == [2064 + c for c in range(32)]
    assert out[192:] == [0] * 64  # columns 96..127 do not exist: zero rows


def test_expert_bytes_are_what_the_kernel_strides_by():
    w = moe.synthetic_experts(2, 192, 48, "cpu")
    p = moe.pack_experts(**w)
    i_pad, h_pad, k13, k2 = 64, 256, 192, 64  # K padded to 64 per GEMM
    assert p.w13[0].numel() == 2 * i_pad * k13 // 2 and p.w13_scales[0].numel() == 2 * i_pad * k13 // 16
    assert p.w2[0].numel() == h_pad * k2 // 2 and p.w2_scales[0].numel() == h_pad * k2 // 16
    assert p.expert_weight_bytes() == sum(t[0].numel() for t in (p.w13, p.w13_scales, p.w2, p.w2_scales))
    assert tuple(p.w13_alpha.shape) == (2, 2) and tuple(p.w2_alpha.shape) == (2,)


def test_bad_expert_tensors_name_the_tensor():
    w = moe.synthetic_experts(2, 64, 32, "cpu")
    with pytest.raises(ValueError, match="w2_weight must have shape"):
        moe.pack_experts(**dict(w, w2_weight=w["w2_weight"][:, :32]))
    with pytest.raises(TypeError, match="w13_weight must be a 3-D"):
        moe.pack_experts(**dict(w, w13_weight=w["w13_weight"].float()))
    with pytest.raises(ValueError, match="w13_weight_scale_2 must have 2 values"):
        moe.pack_experts(**dict(w, w13_weight_scale_2=torch.ones(3)))
    with pytest.raises(ValueError, match="finite and > 0"):
        moe.pack_experts(**dict(w, w2_weight_scale_2=torch.tensor([1.0, 0.0])))
    w = moe.synthetic_experts(1, 64, 32, "cpu")  # cut to I = 24: shapes agree, 24 % 16 != 0
    cut = dict(w, w13_weight=w["w13_weight"][:, :48], w13_weight_scale=w["w13_weight_scale"][:, :48],
               w2_weight=w["w2_weight"][..., :12], w2_weight_scale=w["w2_weight_scale"][..., :1])
    with pytest.raises(ValueError, match="intermediate size 24 is not a positive multiple of 16"):
        moe.pack_experts(**cut)


def test_one_decode_scale_per_expert_is_shared_by_gate_and_up():
    w = moe.synthetic_experts(2, 64, 32, "cpu")
    p = moe.pack_experts(**dict(w, w13_weight_scale_2=torch.tensor([0.5, 0.25])))
    assert p.w13_alpha.tolist() == [[0.5, 0.5], [0.25, 0.25]]


def test_supported_shapes_and_the_call_refuses_cpu_tensors():
    assert moe.moe_w4a16_supported(256, 6144, 256) is None
    assert "1025 local experts" in moe.moe_w4a16_supported(1025, 6144, 256)
    assert "hidden size 100" in moe.moe_w4a16_supported(8, 100, 256)
    w = moe.synthetic_experts(2, 64, 32, "cpu")
    p = moe.pack_experts(**w)
    ids, weights = moe.synthetic_routing(3, 2, 2, "cpu")
    with pytest.raises(ValueError, match="hidden_states must be a CUDA tensor"):
        moe.moe_w4a16(torch.zeros((3, 64), dtype=torch.bfloat16), ids, weights, p)
    with pytest.raises(ValueError, match="active experts"):
        moe.synthetic_routing(3, 4, 8, "cpu", active=2)


def test_routing_gives_distinct_experts_and_leaves_the_inactive_empty():
    ids, w = moe.synthetic_routing(64, 8, 32, "cpu", seed=1, active=12)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert all(len(set(row)) == 8 for row in ids.tolist())
    assert int(ids.max()) < 12
    assert torch.allclose(w.sum(1), torch.ones(64))


def test_warps_per_tile_accept_the_plans_counts_only():
    for bad in (3, 16, -1, True, "4"):
        with pytest.raises(ValueError, match="gate_up_k_warps must be 0 \\(the plan's choice\\), 1, 2, 4 or 8"):
            moe.moe_plan(8, 8, 256, 6144, 256, gate_up_k_warps=bad)
    with pytest.raises(ValueError, match="down_k_warps must be"):
        moe.moe_plan(8, 8, 256, 6144, 256, down_k_warps=6)
