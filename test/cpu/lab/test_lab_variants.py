"""The lab variants the same-tokens probe switches on (lab/variants), the candidate summation
orders for the GPU's compiled moe_sum_reduce (sum_orders.py, the bits test's report), and
`router-ORDER[-divfull]`, the sigmoid routers under Inductor's GPU numerics
(runner/gpu_numerics.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

VARIANTS = Path(__file__).resolve().parents[3] / "lab" / "variants"


def load(name):
    spec = importlib.util.spec_from_file_location(name, VARIANTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_orders_are_distinct_where_fp32_rounds():
    so = load("sum_orders")
    # 1 then seven values of 2^-24: added one by one each is lost (a tie rounds to even); summed
    # among themselves first they survive
    x = torch.tensor([[1.0] + [2.0 ** -24] * 7]).reshape(1, 8, 1).to(torch.bfloat16)
    sums = {k: float(v) for k, v in so.fp32_sums(x).items()}
    assert sums["sequential"] == 1.0
    assert sums["tree"] > 1.0 and sums["butterfly"] > 1.0
    assert set(sums) == {"torch.sum", *so.ORDERS}
    # the hybrids: 2 or 4 consecutive elements per thread first, then the butterfly
    y = torch.tensor([[2.0 ** 24, 1.0, -(2.0 ** 24), 1.0, 1.0, 0.0, 0.0, 0.0]]).reshape(1, 8, 1).to(torch.bfloat16)
    hybrid = {k: float(v) for k, v in so.fp32_sums(y).items()}
    # pairs-butterfly lets 2^24 absorb two of the three 1s before -2^24 cancels it, the others one
    assert hybrid["pairs-butterfly"] == 1.0
    assert all(v == 2.0 for k, v in hybrid.items() if k != "pairs-butterfly")
    assert so.fp32_sums(x[:, :6])["butterfly"].shape == (1, 1)  # a top-k below a power of two pads


def test_exact_sums_agree_in_every_order_and_rounding():
    so = load("sum_orders")
    x = torch.randint(-8, 8, (3, 8, 5)).to(torch.bfloat16)  # small integers: every sum exact
    want = (x.float().sum(dim=1) * 2.0).to(torch.bfloat16)
    for order in ("torch.sum", "sequential", "tree", "butterfly"):
        for rounded in (False, True):
            assert torch.equal(so.reduce(x, 2.0, order, rounded), want)


def test_a_router_variant_puts_the_numerics_twin_on_every_sigmoid_router(monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_LAB_VARIANT", raising=False)
    site = load("sitecustomize")
    from sglang.sm120.runner import gpu_numerics

    assert {f"router-{o}{d}" for o in gpu_numerics.ORDERS for d in ("", "-divfull")} <= set(site.PATCHES)
    module_name, patch = site.PATCHES["router-tree-divfull"]
    assert module_name == "sglang.sm120.runner.dynamo_free"
    seen = []
    monkeypatch.setattr(gpu_numerics, "inductor_gpu_twin", lambda f, o, c: seen.append((f, o, c)) or f)
    fake = SimpleNamespace(TWINS={})
    patch(fake)
    assert set(fake.TWINS) == set(site.SIGMOID_ROUTERS)
    body = lambda: None  # noqa: E731
    assert fake.TWINS["biased_grouped_topk_impl"](body) is body
    assert seen == [(body, "tree", "div_full")]
