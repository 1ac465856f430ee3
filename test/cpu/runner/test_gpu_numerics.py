"""runner/gpu_numerics.py: the summation orders, and the mode that gives a helper's plain body
Inductor's GPU numerics, run on the CPU with stand-ins for its two Triton kernels (the kernels
themselves and the bits they give are GPU tests: test/gpu/test_dynamo_free_bits_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from sglang.sm120.runner import gpu_numerics as gn

# values whose fp32 sum depends on the order: 2**24 + 1 is not representable
BIG = float(2 ** 24)


def _row(values):
    return torch.tensor([values], dtype=torch.float32)


# each order's association, over the eight fp32 parts p of a row
ASSOCIATIONS = {
    "sequential": lambda p: ((((((p[0] + p[1]) + p[2]) + p[3]) + p[4]) + p[5]) + p[6]) + p[7],
    "tree": lambda p: ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])),
    "butterfly": lambda p: ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7])),
    "pairs-butterfly": lambda p: ((p[0] + p[1]) + (p[4] + p[5])) + ((p[2] + p[3]) + (p[6] + p[7])),
    "quads-butterfly": lambda p: (((p[0] + p[1]) + p[2]) + p[3]) + (((p[4] + p[5]) + p[6]) + p[7]),
}


@pytest.mark.parametrize("order", gn.ORDERS)
def test_each_order_adds_in_its_stated_association(order):
    x = _row([BIG, 1, 1, 1, -BIG, 1, 1, 1])
    assert torch.equal(gn.ordered_sum(x, 1, order), ASSOCIATIONS[order]([x[:, k] for k in range(8)]))


def test_orders_differ_where_the_association_matters():
    x = _row([BIG, 1, 1, 1, -BIG, 1, 1, 1])
    sums = {o: float(gn.ordered_sum(x, 1, o)) for o in gn.ORDERS}
    assert len(set(sums.values())) >= 3, sums


def test_ordered_sum_keeps_the_dim_and_refuses_unknown_orders():
    x = torch.randn(3, 8, 5)
    assert gn.ordered_sum(x, 1, "tree", keepdim=True).shape == (3, 1, 5)
    assert torch.allclose(gn.ordered_sum(x, 1, "butterfly"), x.sum(1), atol=1e-5)
    with pytest.raises(ValueError, match="summation order"):
        gn.ordered_sum(x, 1, "random")
    with pytest.raises(ValueError, match="constant_division"):
        gn.InductorGpuNumerics("tree", "exact")


def test_the_kernels_refuse_cpu_tensors():
    with pytest.raises(ValueError, match="CUDA float32"):
        gn.sigmoid(torch.ones(2))
    with pytest.raises(ValueError, match="CUDA float32"):
        gn.div_full(torch.ones(2), torch.ones(2))


@pytest.fixture
def cpu_stand_ins(monkeypatch):
    """The mode redirects CPU fp32 ops too, to recording stand-ins that compute as ATen does."""
    calls = {"sigmoid": 0, "div_full": 0, "sums": []}

    def sigmoid(x):
        calls["sigmoid"] += 1
        return torch.sigmoid(x)

    def div_full(a, b):
        calls["div_full"] += 1
        return a / b

    real_sum = gn.ordered_sum

    def ordered_sum(x, dim, order, keepdim=False):
        calls["sums"].append((x.shape[dim], order))
        return real_sum(x, dim, order, keepdim)

    monkeypatch.setattr(gn, "REDIRECTED_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(gn, "sigmoid", sigmoid)
    monkeypatch.setattr(gn, "div_full", div_full)
    monkeypatch.setattr(gn, "ordered_sum", ordered_sum)
    return calls


def test_the_mode_redirects_sigmoid_division_and_sums(cpu_stand_ins):
    x = torch.randn(4, 8)
    with gn.InductorGpuNumerics("quads-butterfly", "reciprocal"):
        s = x.sigmoid()
        q = s / s.sum(dim=-1, keepdim=True)
        r = s.sum(-1) / 2.5
        small = s[:, :3].sum(dim=1)
        q2 = q.clone()
        q2 /= q.sum(dim=-1, keepdim=True)
        ints = torch.arange(6).view(2, 3).sum(dim=1)  # not fp32: untouched
    assert cpu_stand_ins["sigmoid"] == 1
    assert cpu_stand_ins["div_full"] == 2  # the two tensor / tensor divisions, not the / 2.5
    assert cpu_stand_ins["sums"] == [(8, "quads-butterfly"), (8, "quads-butterfly"), (3, "sequential"),
                                     (8, "quads-butterfly")]
    assert torch.equal(r, gn.ordered_sum(torch.sigmoid(x), 1, "quads-butterfly") * (1 / 2.5))
    assert torch.allclose(q, torch.sigmoid(x) / torch.sigmoid(x).sum(-1, keepdim=True))
    assert torch.equal(small, gn.ordered_sum(torch.sigmoid(x)[:, :3], 1, "sequential"))
    assert torch.equal(ints, torch.tensor([3, 12]))


def test_a_division_by_a_number_as_triton_divides_when_asked(cpu_stand_ins):
    x = torch.randn(5)
    with gn.InductorGpuNumerics("tree", "div_full"):
        y = x / 3.0
    assert cpu_stand_ins["div_full"] == 1
    assert torch.equal(y, x / torch.full_like(x, 3.0))


def test_the_router_body_runs_under_the_mode(cpu_stand_ins):
    """Upstream's biased_grouped_topk_impl (its plain body, the installed base) under the mode:
    its sigmoid, renormalising division and top-k sums go through the redirected ops, and with
    ATen-exact stand-ins it picks the plain body's experts."""
    from sglang.srt.layers.moe import topk as topk_mod

    plain = topk_mod.biased_grouped_topk_impl.__wrapped_eager__
    g = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(19, 160, generator=g) * 2, torch.randn(160, generator=g) * 0.05
    args = (torch.empty(19, 8), logits, bias, 9, True, 1, 1)
    kwargs = dict(num_fused_shared_experts=1, routed_scaling_factor=2.5,
                  apply_routed_scaling_factor_on_output=False)
    want_w, want_ids = plain(*args, **kwargs)
    got_w, got_ids = gn.inductor_gpu_twin(plain, "pairs-butterfly", "reciprocal")(*args, **kwargs)
    assert cpu_stand_ins["sigmoid"] == 1 and cpu_stand_ins["div_full"] >= 1
    assert (8, "pairs-butterfly") in cpu_stand_ins["sums"]
    assert torch.equal(got_ids, want_ids)
    assert torch.allclose(got_w, want_w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("cc", [90, 120])
def test_the_kernels_compile_to_tritons_approximate_ops(cc):
    """Compiled for SM90 and SM120 without a GPU (Triton's own ptxas): the sigmoid is ex2.approx
    and div.full, the division div.full (not IEEE div.rn): the instructions Inductor's fp32 sigmoid
    and division lower to."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sigmoid, div = gn._kernels()
    ptrs = {"sigmoid_kernel": ("x_ptr", "out_ptr"), "div_kernel": ("a_ptr", "b_ptr", "out_ptr")}
    ptx = {}
    for k in (sigmoid, div):
        sig = {**{p: "*fp32" for p in ptrs[k.fn.__name__]}, "n": "i32", "BLOCK": "constexpr"}
        compiled = triton.compile(ASTSource(fn=k, signature=sig, constexprs={"BLOCK": gn.BLOCK}),
                                  target=GPUTarget("cuda", cc, 32))
        ptx[k.fn.__name__] = compiled.asm["ptx"]
    assert "ex2.approx" in ptx["sigmoid_kernel"] and "div.full.f32" in ptx["sigmoid_kernel"]
    assert "div.full.f32" in ptx["div_kernel"]
    assert not any("div.rn" in p for p in ptx.values())


@pytest.mark.parametrize("experts,scale", [(16, 1.0), (256, 2.5)])
def test_the_router_twin_gives_inductors_cpu_bits_with_the_cpu_numerics(cpu_stand_ins, experts, scale):
    """The mode's machinery against a real compiled kernel: on the CPU, Inductor's sigmoid and
    divisions are ATen's (the stand-ins compute them so), so the twin must give the CPU kernel's
    bits once its order and constant division are Inductor's CPU choices (measured: a butterfly
    sum, the constant division kept a division). GLM-4.5 / GLM-5 routing: one expert group, top-8
    plus the fused shared expert. The GPU test finds the GPU's choices the same way."""
    import dynamo_free_cases as dfc
    from sglang.srt.layers.moe import topk as topk_mod

    helper = topk_mod.biased_grouped_topk_impl
    twin = gn.inductor_gpu_twin(helper.__wrapped_eager__, "butterfly", "div_full")
    torch._dynamo.reset()
    for tokens in (7, 33, 256):
        g = torch.Generator().manual_seed(tokens * 131 + experts)
        logits, bias = torch.randn(tokens, experts, generator=g) * 2, torch.randn(experts, generator=g) * 0.05
        args = (torch.empty(tokens, 8), logits, bias, 9, True, 1, 1)
        kwargs = dict(num_fused_shared_experts=1, routed_scaling_factor=scale,
                      apply_routed_scaling_factor_on_output=False)
        with dfc.mode(False):
            compiled = helper(*args, **kwargs)
        with dfc.mode(True):
            plain = helper(*args, **kwargs)
        got = twin(*args, **kwargs)
        assert dfc.bitwise_equal(got, compiled), (tokens, dfc.differing(got, compiled))
        assert torch.equal(plain[1], compiled[1])
        if tokens == 256:  # the plain body is not the compiled kernel: the twin is what fixes it
            assert not dfc.bitwise_equal(plain, compiled)
