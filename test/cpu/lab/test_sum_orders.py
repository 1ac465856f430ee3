"""lab/variants/sum_orders.py: the candidate summation orders for the GPU's compiled moe_sum_reduce,
and the `sum-ORDER[-rounded]` lab variants that swap them in for the Dynamo-free twin."""
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
    assert so.fp32_sums(x[:, :6])["butterfly"].shape == (1, 1)  # a top-k below a power of two pads


def test_exact_sums_agree_in_every_order_and_rounding():
    so = load("sum_orders")
    x = torch.randint(-8, 8, (3, 8, 5)).to(torch.bfloat16)  # small integers: every sum exact
    want = (x.float().sum(dim=1) * 2.0).to(torch.bfloat16)
    for order in ("torch.sum", "sequential", "tree", "butterfly"):
        for rounded in (False, True):
            assert torch.equal(so.reduce(x, 2.0, order, rounded), want)


def test_a_sum_variant_replaces_the_twin(monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_LAB_VARIANT", raising=False)
    site = load("sitecustomize")
    assert {f"sum-{o}{r}" for o in ("sequential", "tree", "butterfly") for r in ("", "-rounded")} <= set(site.PATCHES)
    module_name, patch = site.PATCHES["sum-tree-rounded"]
    assert module_name == "sglang.sm120.runner.dynamo_free"
    fake = SimpleNamespace(TWINS={})
    monkeypatch.setitem(sys.modules, "sum_orders", load("sum_orders"))  # what lab/variants on PYTHONPATH gives
    patch(fake)
    twin = fake.TWINS["moe_sum_reduce_torch_compile"](None)
    x = torch.tensor([[1.0] + [2.0 ** -24] * 7]).reshape(1, 8, 1).to(torch.bfloat16)
    out = torch.empty(1, 1, dtype=torch.bfloat16)
    twin(x, out, 1.0)
    assert torch.equal(out, load("sum_orders").reduce(x, 1.0, "tree", True))
