"""sglang.sm120.moe_tolerance without a GPU: the same MoE with its fp32 sums in another order (the
16-value blocks of H and of I permuted, scales with them) stays within the bound; a wrong expert,
swapped gate and up, a dropped slot, a gate_up block dropped or a result 1% off does not; a token with no local
expert must be exactly 0."""
import pytest
import torch

from sglang.sm120.kernels import moe
from sglang.sm120.moe_tolerance import compare_moe, moe_bound

pytestmark = pytest.mark.base_independent

E, H, I, T, TOPK, SCALE = 6, 128, 64, 9, 3, 2.5


@pytest.fixture(scope="module")
def case():
    tensors = moe.synthetic_experts(E, H, I, "cpu", seed=3, std=0.05)
    ids, w = moe.synthetic_routing(T, TOPK, E, "cpu", seed=4)
    x = (torch.randn(T, H, generator=torch.Generator().manual_seed(5))).to(torch.bfloat16)
    ref = moe.moe_reference(x, ids, w, **tensors, routed_scaling_factor=SCALE)
    bound = moe_bound(x, ids, w, **tensors, routed_scaling_factor=SCALE)
    return tensors, ids, w, x, ref, bound


def _run(x, ids, w, tensors):
    return moe.moe_reference(x, ids, w, **tensors, routed_scaling_factor=SCALE)


def _blocks(n, seed):
    """A permutation of n columns that moves whole 16-column blocks (scales move with them)."""
    p = torch.randperm(n // 16, generator=torch.Generator().manual_seed(seed))
    return (p[:, None] * 16 + torch.arange(16)).reshape(-1)


def _reordered(x, tensors):
    """The same MoE with H's and I's blocks permuted: every product the same, the sums in another order."""
    ph, pi = _blocks(H, 1), _blocks(I, 2)
    hb = (ph.view(-1, 16)[:, 0] // 2)[:, None] + torch.arange(8)  # packed bytes of each moved block
    ib = (pi.view(-1, 16)[:, 0] // 2)[:, None] + torch.arange(8)
    t = dict(tensors)
    t["w13_weight"] = tensors["w13_weight"][:, :, hb.reshape(-1)]
    t["w13_weight_scale"] = tensors["w13_weight_scale"][:, :, ph.view(-1, 16)[:, 0] // 16]
    rows = torch.cat([pi, pi + I])  # gate and up rows of I permuted alike
    t["w13_weight"] = t["w13_weight"][:, rows]
    t["w13_weight_scale"] = t["w13_weight_scale"][:, rows]
    t["w2_weight"] = tensors["w2_weight"][:, :, ib.reshape(-1)]
    t["w2_weight_scale"] = tensors["w2_weight_scale"][:, :, pi.view(-1, 16)[:, 0] // 16]
    return x[:, ph].contiguous(), {k: v.contiguous() for k, v in t.items()}


def test_another_summation_order_is_within_the_bound(case):
    tensors, ids, w, x, ref, bound = case
    xr, tr = _reordered(x, tensors)
    y = _run(xr, ids, w, tr)
    c = compare_moe(y, ref, bound)
    assert c.ok, c.summary()
    assert c.worst < 1.0


@pytest.mark.parametrize("broken", ["wrong expert", "gate and up swapped", "slot dropped", "gate_up block dropped",
                                    "scaled by 1%"])
def test_wrong_results_are_outside_the_bound(case, broken):
    tensors, ids, w, x, ref, bound = case
    t = dict(tensors)
    if broken == "wrong expert":
        ids = (ids + 1) % E
    elif broken == "gate and up swapped":
        t["w13_weight"] = torch.cat([tensors["w13_weight"][:, I:], tensors["w13_weight"][:, :I]], dim=1)
        t["w13_weight_scale"] = torch.cat([tensors["w13_weight_scale"][:, I:], tensors["w13_weight_scale"][:, :I]], dim=1)
    elif broken == "slot dropped":
        w = w.clone()
        w[:, 1] = 0
    elif broken == "gate_up block dropped":
        t["w13_weight"] = tensors["w13_weight"].clone()
        t["w13_weight"][:, :, 8:16] = 0  # values 16..31 of every gate_up row
    y = _run(x, ids, w, t)
    if broken == "scaled by 1%":
        y = (y.float() * 1.01).to(torch.bfloat16)
    c = compare_moe(y, ref, bound)
    assert not c.ok, f"{broken}: {c.summary()}"


def test_a_token_without_a_local_expert_must_be_exactly_zero(case):
    tensors, ids, w, x, _, _ = case
    ids = ids.clone()
    ids[0] = torch.tensor([E, E + 5, -1])[:TOPK]  # token 0: no local expert (expert parallelism)
    ref = _run(x, ids, w, tensors)
    bound = moe_bound(x, ids, w, **tensors, routed_scaling_factor=SCALE)
    assert bool((bound[0] == 0).all()) and bool((ref[0] == 0).all())
    y = ref.clone()
    assert compare_moe(y, ref, bound).ok
    y[0, 3] = 2.0 ** -100
    assert not compare_moe(y, ref, bound).ok
