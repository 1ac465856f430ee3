"""The Dynamo-free forms of moe_sum_reduce and the sigmoid router give the GPU's compiled bits
(issue 43; GPU).

Every MoE family serving a batch of <= 32 tokens reduces the top-k expert outputs through
upstream's torch.compile'd `moe_sum_reduce_torch_compile`; in Dynamo-free mode its eager twin
runs instead (runner/dynamo_free.py). The CPU tests hold the twin to Inductor's CPU kernel only
below top-k 8. On the H100 (session 2026-12-05) the same-tokens probe traced layerwise's
remaining first differences at batches of 17, 33, 200 and 1000 (a short last prefill chunk, a
small decode batch) to the helpers: with upstream's compiled helpers those batches matched graphs
disabled, with the twin they did not. So this compares, on the GPU, the Dynamo-free form with
torch.compile's at the top-k values, token counts, widths and scales of the shipped models, bit
for bit; values span several binades so the fp32 sum's order shows.

The H100 run of session 13 found moe_sum_reduce's twin exact at every case, and the layerwise
differences that upstream's compiled helpers still remove in GLM-4.5-style routing (one expert
group, the shared expert fused into the top-k: upstream's default at EP 1), which reaches the
compiled `biased_grouped_topk_impl`; its Dynamo-free form is the plain body, whose sigmoid and
renormalising division are ATen's, not Triton's. The router test compares the two on router
logits of the tiny glm4_moe, GLM-4.5 and GLM-5 shapes, and each candidate twin
(runner/gpu_numerics.inductor_gpu_twin: Triton's sigmoid and division, a summation order, a
division by a number as a reciprocal product or as Triton's division) against the compiled bits.

With SGLANG_SM120_RESULTS_DIR it writes dynamo-free-bits-gpu.json there: per case equal or not,
and for each unequal one which eager summation order gives the compiled bits (lab/variants/
sum_orders.py: sequential, pairwise tree, lane butterfly; the sum rounded before the scale or not):
what the twin must do; for the router, which candidate twin (the probe's `lw-exact-router-*`).

    SGLANG_SM120_RESULTS_DIR=$OUT PYTHONPATH=/tmp/site python3 -m pytest -q test/gpu/test_dynamo_free_bits_gpu.py
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import dynamo_free_cases as dfc  # noqa: E402 (test/cpu: the CPU bit tests' mode switch and comparison)

pytestmark = [pytest.mark.gpu]

# 9: GLM-4.5 / GLM-5 / DeepSeek-V3 routing with the shared expert fused into the top-k (upstream's
# default at EP 1); a non-power-of-two reduction, which Triton pads and ATen does not
TOPK = (9, 8, 6, 4, 2)
TOKENS = (1, 7, 17, 32)
WIDTHS = (256, 7168)  # tiny models, GLM-5 / DeepSeek (each width x scale x top-k compiles twice)
SCALES = (2.5, 1.0)
# Inductor compiles a dynamic-shape kernel with the first call's sizes as hints, and its launch
# configuration (so, possibly, how a reduction's elements spread over a thread's registers and
# the lanes: the summation order) follows the hints. A server's first call is its first capture
# or warm-up size, not the test's: each case is therefore compiled after each of these first
# calls (token counts; () = the cases' own order, the first dynamic compile at the second count).
SUM_FIRST_CALLS = ((), (32,))
ROUTER_FIRST_CALLS = ((), (2048,), (8192,))
RESULTS: dict = {}


def _inputs(tokens: int, topk: int, width: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mant = torch.randn(tokens, topk, width, generator=g, device="cuda")
    # expert outputs times routing weights: magnitudes over ~6 binades, so fp32 sums round
    expo = torch.randint(-3, 4, (tokens, topk, 1), generator=g, device="cuda").float()
    return (mant * torch.exp2(expo)).to(torch.bfloat16)


def _run(helper, x, scale, dynamo_free: bool):
    with dfc.mode(dynamo_free):
        out = torch.empty(x.shape[0], x.shape[2], dtype=x.dtype, device=x.device)
        helper(x, out, scale)
        torch.cuda.synchronize()
        return out


@functools.lru_cache(maxsize=None)
def _sum_orders():
    """lab/variants/sum_orders.py, loaded by path (the lab variants use the same candidates)."""
    path = Path(__file__).resolve().parents[2] / "lab" / "variants" / "sum_orders.py"
    spec = importlib.util.spec_from_file_location("sum_orders", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _matching_orders(x, scale, compiled):
    orders = _sum_orders()
    return [f"{order}{', sum rounded before the scale' if rounded else ', one rounding'}"
            for order in orders.fp32_sums(x[:1]) for rounded in (False, True)
            if dfc.bitwise_equal(orders.reduce(x, scale, order, rounded), compiled)]


def _write():
    out = os.environ.get("SGLANG_SM120_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "dynamo-free-bits-gpu.json").write_text(json.dumps(RESULTS, indent=1) + "\n")


@pytest.fixture(scope="module")
def helper():
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA GPU")
    from sglang.sm120 import upstream_api

    return upstream_api.require("fused_moe.moe_sum_reduce_torch_compile")


@pytest.mark.parametrize("topk", TOPK)
def test_moe_sum_reduce_twin_gives_the_compiled_bits(helper, topk):
    failures = []
    for width, scale, first in ((w, s, f) for w in WIDTHS for s in SCALES for f in SUM_FIRST_CALLS):
        # a server's helper sees one top-k and width and many token counts: Dynamo compiles it
        # for the first count, then with the count dynamic; varying top-k or width in one
        # Dynamo cache would make them dynamic too (another reduction kernel), so start afresh
        torch._dynamo.reset()
        for tokens in first:
            _run(helper, _inputs(tokens, topk, width, seed=1), scale, dynamo_free=False)
        for tokens in TOKENS:
            x = _inputs(tokens, topk, width, seed=tokens * 7919 + width + topk)
            compiled = _run(helper, x, scale, dynamo_free=False)
            eager = _run(helper, x, scale, dynamo_free=True)
            key = f"topk{topk} tokens{tokens} width{width} scale{scale}" + "".join(f" first{t}" for t in first)
            equal = dfc.bitwise_equal(eager, compiled)
            RESULTS[key] = {"equal": equal}
            if not equal:
                RESULTS[key]["differing_values"] = int((eager != compiled).sum())
                RESULTS[key]["orders_giving_the_compiled_bits"] = _matching_orders(x, scale, compiled)
                failures.append(key)
    _write()
    assert not failures, "Dynamo-free moe_sum_reduce differs from the compiled one at: " + "; ".join(
        f"{k} ({RESULTS[k]['differing_values']} values; compiled bits from: "
        f"{RESULTS[k]['orders_giving_the_compiled_bits'] or 'none of the candidate orders'})" for k in failures)


# (experts, top-k with the fused shared expert, routed scaling factor): the tiny glm4_moe, GLM-4.5
# (160 routed experts), GLM-5 (256); one expert group, as those configs have
ROUTERS = ((16, 9, 1.0), (160, 9, 2.5), (256, 9, 2.5))
ROUTER_TOKENS = (1, 7, 33, 256, 1024, 4096)  # 4096: a prefill chunk


def _router_inputs(tokens: int, experts: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g, device="cuda") * 2.0
    bias = torch.randn(experts, generator=g, device="cuda") * 0.05
    return torch.empty(tokens, 8, device="cuda"), logits, bias


def _route(fn, inputs, topk, scale):
    hidden, logits, bias = inputs
    out = fn(hidden, logits, bias, topk, True, 1, 1, num_fused_shared_experts=1,
             routed_scaling_factor=scale, apply_routed_scaling_factor_on_output=False)
    torch.cuda.synchronize()
    return out


def test_sigmoid_router_gives_the_compiled_bits():
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA GPU")
    from sglang.sm120.runner import gpu_numerics
    from sglang.srt.layers.moe import topk as topk_mod

    helper = topk_mod.biased_grouped_topk_impl
    plain = helper.__wrapped_eager__
    candidates = {f"{o}, constant division {c}": gpu_numerics.inductor_gpu_twin(plain, o, c)
                  for o in gpu_numerics.ORDERS for c in gpu_numerics.CONSTANT_DIVISIONS}
    failures = []
    for (experts, topk, scale), first in ((r, f) for r in ROUTERS for f in ROUTER_FIRST_CALLS):
        torch._dynamo.reset()  # one server's router: one shape family, the token count dynamic
        with dfc.mode(False):
            for tokens in first:
                _route(helper, _router_inputs(tokens, experts, seed=1), topk, scale)
        for tokens in ROUTER_TOKENS:
            x = _router_inputs(tokens, experts, seed=tokens * 131 + experts)
            with dfc.mode(False):
                compiled = _route(helper, x, topk, scale)
            with dfc.mode(True):
                eager = _route(helper, x, topk, scale)
            key = f"router experts{experts} topk{topk} scale{scale} tokens{tokens}" + "".join(f" first{t}" for t in first)
            equal = dfc.bitwise_equal(eager, compiled)
            RESULTS[key] = {"equal": equal, "ids_equal": bool(torch.equal(eager[1], compiled[1]))}
            if not equal:
                RESULTS[key]["differing_weights"] = int((eager[0] != compiled[0]).sum())
                RESULTS[key]["candidates_giving_the_compiled_bits"] = [
                    name for name, twin in candidates.items()
                    if dfc.bitwise_equal(_route(twin, x, topk, scale), compiled)]
                failures.append(key)
    _write()
    assert not failures, "Dynamo-free biased_grouped_topk_impl differs from the compiled one at: " + "; ".join(
        f"{k} ({RESULTS[k]['differing_weights']} weights, ids equal: {RESULTS[k]['ids_equal']}; compiled bits "
        f"from: {RESULTS[k]['candidates_giving_the_compiled_bits'] or 'no candidate'})" for k in failures)
