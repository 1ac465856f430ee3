"""The lab variants the same-tokens probe switches on (lab/variants): `sum-ORDER[-rounded]`, the
candidate summation orders for the GPU's compiled moe_sum_reduce (sum_orders.py), and
`zero-pad-decode`, padded decode rows of 0 KV pages where FlashInfer's plan allows it
(decode_plan.py, a restatement of FlashInfer's split search)."""
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


def test_a_sum_variant_replaces_the_twin(monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_LAB_VARIANT", raising=False)
    site = load("sitecustomize")
    orders = load("sum_orders").ORDERS
    assert {f"sum-{o}{r}" for o in orders for r in ("", "-rounded")} <= set(site.PATCHES)
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


def _items(pages, chunk):
    return sum(-(-max(p, 1) // chunk) for p in pages)


def test_decode_plan_finds_the_smallest_chunk_that_fits_and_zero_rows_leave_it_alone():
    import random

    dp = load("decode_plan")
    rng = random.Random(5)
    for _ in range(300):
        real = [rng.randint(1, 1500) for _ in range(rng.randint(1, 600))]
        budget = rng.randint(len(real) + 1, 2 * len(real) + 40)
        pad = rng.randint(1, 64)
        chunk, items = dp.split(real, budget)
        assert items == _items(real, chunk)
        # the smallest chunk of at least 128 pages whose chunks fit the budget (or the longest row)
        assert chunk >= 128 and (items <= budget or chunk == max(real))
        assert chunk == 128 or _items(real, chunk - 1) > budget
        # padded rows of 0 pages: the real rows' own chunk, one work item each on top
        assert dp.split(real + [0] * pad, budget) == (chunk, items + pad)
        assert dp.zero_padding_fits(real, pad, budget) == (items + pad <= budget)
    # one-page padded rows (upstream's fill) can change a long request's chunk
    real = [1024] * 4  # 32 chunks of 128 pages fit a budget of 40; with 10 one-page rows they do not
    assert dp.split(real, 40)[0] == 128 and dp.split(real + [1] * 10, 40)[0] > 128
    assert dp.zero_padding_fits(real, 8, 40) and not dp.zero_padding_fits(real, 9, 40)


def test_zero_pad_decode_learns_the_budget_then_pads_with_zero_pages_where_it_fits(monkeypatch):
    monkeypatch.setitem(sys.modules, "decode_plan", load("decode_plan"))
    site = load("sitecustomize")
    _, patch = site.PATCHES["zero-pad-decode"]

    class BatchDecodeWithPagedKVCacheWrapper:  # FlashInfer's name; plan info as DecodePlanInfo
        _plan_info = [40, 0, 0, 0, 0, 0, 0, 0, True, True]

    class Slot:
        pad_value = 1

    seen = []

    class LayerwiseDecodeRunner:
        def __init__(self):
            self.seq_len_fill_value = 1
            self.capture_bs = [8, 16]
            self._lw_finished = True
            self.slots = {"seq_lens": Slot(), "seq_lens_cpu": Slot()}
            self.buffer_registry = SimpleNamespace(get_slot=self.slots.__getitem__)
            self.attn_backend = SimpleNamespace(decode_cuda_graph_metadata={16: [BatchDecodeWithPagedKVCacheWrapper()]})
            self.model_runner = SimpleNamespace(server_args=SimpleNamespace(page_size=1))

        def load_batch(self, forward_batch):
            seen.append((self.seq_len_fill_value, self.slots["seq_lens"].pad_value, self.slots["seq_lens_cpu"].pad_value))

    module = SimpleNamespace(LayerwiseDecodeRunner=LayerwiseDecodeRunner)
    patch(module)
    runner = LayerwiseDecodeRunner()
    batch = lambda lens: SimpleNamespace(batch_size=len(lens), seq_lens_cpu=torch.tensor(lens))  # noqa: E731
    runner.load_batch(batch([1024] * 4 + [3] * 6))   # 10 -> 16: 32 + 6 chunks + 6 padded rows: 44 > 40
    runner.load_batch(batch([1024] * 4 + [3]))       # 32 + 1 chunks, 11 padded rows: 44 > 40
    runner.load_batch(batch([1024] * 3 + [3] * 9))   # 24 + 9 chunks, 4 padded rows: 37 fits
    runner.load_batch(batch([5] * 8))                # a captured size: no padding, upstream's fill
    runner.attn_backend.decode_cuda_graph_metadata[16][0]._plan_info = [16] + [0] * 9  # not split
    runner._zp_budget.clear()
    runner.load_batch(batch([1024] * 3 + [3] * 9))   # no split-mode plan to read: upstream's fill
    assert seen == [(1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1)]
    assert runner.seq_len_fill_value == 1
