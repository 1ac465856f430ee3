"""Layerwise CUDA-graph sizes come from upstream's own resolution, on every card (either base).

For each card (GPU facts faked only at the probes upstream reads: plan.cards.faked_card), TP size
and model (GLM-5's and Qwen3-30B-A3B's real configs), the same command line is resolved by
upstream alone (no fork flag) and with `--enable-piecewise-cuda-graph`. Every expected value is
read from upstream's resolution in the same test: the full-graph ceiling is upstream's decode max
batch size and its full graphs are exactly upstream's list; prefill buckets stop at upstream's
prefill max (the chunked prefill size); an explicit --cuda-graph-max-bs-decode or
--max-running-requests is honoured as upstream honours it.
"""
import functools

import pytest

from sglang.sm120.plan import cards, models
from sglang.sm120.plan.resolve import captured_decode_sizes, resolve
from sglang.sm120.runner.sizes import LAYERWISE_DECODE_MAX_BS

CARDS_TP = [("h200", 1), ("rtx-pro-6000", 1), ("rtx-pro-6000", 8), ("rtx-5090", 1), ("b200", 8)]
MODELS = ("glm-5", "qwen3-30b-a3b")
ENABLE = ("--enable-piecewise-cuda-graph",)
RUNNING = 200  # below every card's default ceiling but the RTX 5090's


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {m: models.write_config(models.KNOWN[m](), str(tmp_path_factory.mktemp(m))) for m in MODELS}


@pytest.fixture(scope="module")
def resolved(model_dirs):
    @functools.lru_cache(maxsize=None)
    def run(model, card, tp, extra=()):
        return resolve(model_dirs[model], cards.card(card), ["--tp-size", str(tp), *extra])
    return run


def _full(decode):
    return [s for s in decode["bs"] if s <= decode["layerwise_full_max_bs"]]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("card,tp", CARDS_TP)
def test_the_full_graph_ceiling_and_prefill_buckets_are_upstreams(resolved, model, card, tp):
    upstream, ours = resolved(model, card, tp), resolved(model, card, tp, ENABLE)
    assert upstream.decode["backend"] == "full" and ours.decode["backend"] == "layerwise", ours.log
    assert ours.decode["layerwise_full_max_bs"] == upstream.decode["max_bs"]
    assert _full(ours.decode) == list(upstream.decode["bs"])  # the very graphs upstream captures
    assert ours.decode["max_bs"] == max(LAYERWISE_DECODE_MAX_BS, upstream.decode["max_bs"])
    assert ours.chunked_prefill_size == upstream.chunked_prefill_size
    if ours.prefill["backend"] == "layerwise":
        assert max(ours.prefill["bs"]) == ours.prefill["max_bs"] == upstream.prefill["max_bs"]
        assert ours.prefill["max_bs"] <= upstream.chunked_prefill_size
        assert ours.mem_fraction_static == upstream.mem_fraction_static  # upstream's memory budget
    else:  # a phase layerwise does not support runs what upstream resolves for it (MLA prefill)
        assert (ours.prefill["backend"], model) == (upstream.prefill["backend"], "glm-5"), ours.log
        # upstream budgeted for prefill graphs before the fallback: never less headroom than upstream
        assert ours.mem_fraction_static <= upstream.mem_fraction_static


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("card,tp", CARDS_TP)
def test_max_running_requests_lowers_the_ceiling_and_caps_the_top_as_upstream(resolved, model, card, tp):
    flags = ("--max-running-requests", str(RUNNING))
    upstream, ours = resolved(model, card, tp, flags), resolved(model, card, tp, ENABLE + flags)
    captured = captured_decode_sizes(upstream)
    assert ours.decode["layerwise_full_max_bs"] == max(captured)
    assert _full(ours.decode) == captured
    # upstream never captures a batch its request pool cannot hold
    assert ours.decode["max_bs"] == upstream.max_running_requests == RUNNING


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("card,tp", CARDS_TP)
def test_an_explicit_decode_max_bs_is_the_top_over_upstreams_default_ceiling(resolved, model, card, tp):
    flags = ("--cuda-graph-max-bs-decode", "1024")
    default, upstream = resolved(model, card, tp), resolved(model, card, tp, flags)
    ours = resolved(model, card, tp, ENABLE + flags)
    assert ours.decode["max_bs"] == upstream.decode["max_bs"]  # what upstream captures with the flag
    assert ours.decode["layerwise_full_max_bs"] == default.decode["max_bs"]  # upstream's card default
    assert _full(ours.decode) == list(default.decode["bs"])


def test_the_layerwise_plan_runs_after_upstreams_last_resolution_step():
    """Every value the plan reads (memory-derived sizes, backends) is final only after upstream's
    whole resolution: the last run_hook step of 0.5.23's pipeline, the end of 0.5.16's
    __post_init__."""
    import inspect
    import re

    from sglang.sm120 import upstream_api

    if upstream_api.has("resolution_step.last"):
        from sglang.sm120.runner import resolution_hook
        from sglang.srt.arg_groups import pipeline

        steps = re.findall(r"run_hook\((\w+), server_args\)", inspect.getsource(pipeline.run_resolution_pipeline))
        assert steps[-1] == resolution_hook.LAST_STEP
        assert steps.index("handle_gpu_memory_settings") < len(steps) - 1
    else:
        from sglang.srt.server_args import ServerArgs

        body = inspect.getsource(ServerArgs.__post_init__)
        assert body.rindex("finalize_server_args(self)") > body.rindex("self._handle_")
