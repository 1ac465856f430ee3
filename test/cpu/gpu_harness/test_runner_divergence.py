"""The GPU correctness test's bookkeeping: pairing, near-tie classification, the table.

The first H200 run reported 'bs=1 ... prompt=0' for every bs=1 divergence (the index inside a
one-prompt group) and could not tell a near-tie flip from a real mismatch. These run the GPU
test's own functions on synthetic engine outputs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
C = pytest.importorskip("test_layerwise_correctness")  # test/gpu is on pytest.ini's pythonpath


def _gen(tokens, lps, tops):
    return C.Gen(list(tokens), list(lps), [dict(t) for t in tops])


def _meta(tokens, lps, tops):
    return {
        "output_ids": list(tokens),
        "meta_info": {
            "output_token_logprobs": [(lp, t, None) for t, lp in zip(tokens, lps)],
            "output_top_logprobs": [[(lp, t, None) for t, lp in top.items()] for top in tops],
        },
    }


def test_parse_output_reads_sglang_meta_info_and_checks_ids():
    tops = [{5: -0.1, 6: -2.0}, {7: -0.3, 5: -1.5}]
    g = C.parse_output(_meta([5, 7], [-0.1, -0.3], tops))
    assert g.tokens == [5, 7] and g.logprobs == [-0.1, -0.3] and g.top == tops
    bad = _meta([5, 7], [-0.1, -0.3], tops)
    bad["output_ids"] = [5, 8]
    with pytest.raises(AssertionError):
        C.parse_output(bad)


def test_classify_identical_flip_and_mismatch():
    ref = _gen([1, 2, 3], [-0.5, -0.7, -0.1], [{1: -0.5, 9: -3}, {2: -0.7, 4: -0.8}, {3: -0.1, 4: -4}])
    same = _gen([1, 2, 3], [-0.52, -0.7, -0.1], ref.top)
    v = C.classify(ref, same, 0.25)
    assert v.kind == "identical" and abs(v.max_abs_delta - 0.02) < 1e-9 and v.delta_position == 0
    # token 1: ref prefers 2 over 4 by 0.1 nats, the other run prefers 4 over 2 by 0.05: a tie
    flip = _gen([1, 4, 3], [-0.5, -0.74, -0.1], [{1: -0.5}, {4: -0.74, 2: -0.79}, {3: -0.1}])
    v = C.classify(ref, flip, 0.25)
    assert (v.kind, v.position) == ("flip", 1) and abs(v.gap - 0.1) < 1e-9
    assert C.classify(ref, flip, 0.05).kind == "mismatch"
    # a token outside the reference's top-k: at least the top-1 minus the last listed logprob
    far = _gen([9, 2, 3], [-0.4, -0.7, -0.1], [{9: -0.4, 1: -0.6}, {2: -0.7}, {3: -0.1}])
    v = C.classify(ref, far, 0.25)
    assert v.kind == "mismatch" and v.position == 0 and v.gap >= 2.5
    assert C.classify(ref, _gen([1, 2], [-0.5, -0.7], ref.top[:2]), 0.25).kind == "mismatch"


def test_compare_groups_pairs_by_group_and_request_and_labels_both():
    ref_a = _gen([1], [-0.1], [{1: -0.1, 2: -5}])
    ref_b = _gen([2], [-0.1], [{2: -0.1, 1: -5}])
    groups = [(1, 7, [[0]]), (1, 7, [[0]]), (2, 7, [[0], [0]])]
    reference = [[ref_a], [ref_b], [ref_a, ref_b]]
    got = [[ref_a], [ref_a], [ref_a, ref_b]]  # group 1 got group 0's answer
    cells = C.compare_groups(groups, reference, got, 0.25)
    assert (cells[(1, 7)].identical, cells[(1, 7)].mismatches) == (1, 1)
    assert cells[(1, 7)].examples == ["group=1 bs=1 len=7 req=0 mismatch at token 0 (gap 4.9)"]
    assert cells[(2, 7)].identical == 2
    with pytest.raises(AssertionError):
        C.compare_groups(groups, reference, got[:2], 0.25)
    with pytest.raises(AssertionError):
        C.compare_groups(groups, reference, [[ref_a], [ref_a], [ref_a]], 0.25)
    table = C.render_table("t", {"disabled-repeat": cells, "layerwise": cells})
    assert "    1     7 layerwise             1      0     1" in table


def test_cells_and_totals_name_where_the_largest_delta_was():
    ref = _gen([1, 2], [-0.5, -0.7], [{1: -0.5}, {2: -0.7}])
    near = _gen([1, 2], [-0.6, -0.7], ref.top)  # 0.1 at token 0
    far = _gen([1, 2], [-0.5, -1.2], ref.top)  # 0.5 at token 1
    groups = [(1, 7, [[0]]), (1, 7, [[0]]), (1, 128, [[0]])]
    cells = C.compare_groups(groups, [[ref], [ref], [ref]], [[near], [far], [near]], 0.25)
    assert cells[(1, 7)].max_abs_delta_at == "group=1 bs=1 len=7 req=0 token 1"
    assert cells[(1, 128)].max_abs_delta_at == "group=2 bs=1 len=128 req=0 token 0"
    assert C.totals(cells).max_abs_delta_at == "group=1 bs=1 len=7 req=0 token 1"


def test_mode_kwargs_control_and_layerwise():
    from sglang.sm120.runner.config import default_prefill_req_slots, plan_prefill

    kw = C.mode_kwargs("full", "qwen3_moe")
    assert kw["cuda_graph_backend_decode"] == "full"
    # the control's fixed-slot prefill graphs get the plan layerwise resolves by default
    want = plan_prefill(max_tokens=C.PREFILL_CHUNK, req_slots=default_prefill_req_slots(C.PREFILL_CHUNK, C.MAX_RUNNING))
    assert kw["cuda_graph_config"] == {"prefill": {"backend": "full", "bs": list(want.buckets),
                                                   "max_bs": max(want.buckets), "full_prefill_max_req": want.req_slots}}
    assert want.req_slots > 17  # upstream's own default (8192 // 512 = 16) ran bs 17 eagerly
    assert C.mode_kwargs("full", "deepseek_v2") == dict(cuda_graph_backend_decode="full")  # MLA: upstream's prefill
    assert C.mode_kwargs("every_size", "qwen3_moe")["cuda_graph_layerwise_every_size"] is True
    assert C.mode_kwargs("disabled", "x")["cuda_graph_backend_decode"] == "disabled"


def _cell(ident, flips, real, labels=(), delta=0.1):
    c = C.Cell(identical=ident, flips=flips, mismatches=real, max_abs_delta=delta)
    c.mismatch_labels = list(labels) or [f"p{i}" for i in range(real)]
    return c


def _failures(*args, **kw):
    return C.judge(*args, **kw).failures


def test_noisy_reference_is_judged_against_its_noise_floor():
    noise = _cell(586, 137, 9)
    control = _cell(584, 142, 6)
    assert _failures("full", control, None, noise, "nvfp4") == []  # the control is recorded, not judged on counts
    assert _failures("full", _cell(400, 300, 80), None, noise, "nvfp4") == []
    assert _failures("layerwise", _cell(572, 151, 9), control, noise, "nvfp4") == []
    # twice the noise floor's real mismatches, or far more flips, still fails
    bad = _failures("layerwise", _cell(550, 150, 32), control, noise, "nvfp4")
    assert len(bad) == 1 and "32 real mismatches > 15.5" in bad[0]
    bad = _failures("every_size", _cell(400, 323, 9), control, noise, "nvfp4")
    assert len(bad) == 1 and "near-tie flips" in bad[0]
    # a noisy reference never asks for prompt-by-prompt identity with the (equally noisy) control
    assert _failures("layerwise", _cell(572, 151, 9), control, noise, "nvfp4", vs_control=_cell(600, 120, 12)) == []


def test_same_kernels_as_the_control_means_identical_to_it():
    """bf16 (graphs disabled repeats itself): where layerwise runs the control's kernels it must give
    the control's greedy tokens on every prompt: a recorded qwen3_moe bf16 FA2 run does (its cells
    equal the control's), a recorded deepseek_v2 bf16 run does not (two prompts at bs 1)."""
    noise = _cell(4461, 0, 0)
    control = _cell(3881, 518, 62)  # upstream's own graphs, FA2 captured prefill: > 10% flips, recorded
    assert _failures("full", control, None, noise, "bf16") == []
    same = _cell(3881, 518, 62)
    verdict = C.judge("layerwise", same, control, noise, "bf16", vs_control=_cell(4461, 0, 0))
    assert verdict.failures == [] and verdict.targets["layerwise_prompts_differing_from_control"] == {
        "value": 0, "target": 0, "met": True}
    bad = _failures("every_size", _cell(4459, 1, 1), _cell(4461, 0, 0), noise, "bf16",
                    vs_control=_cell(4459, 1, 1, labels=["group=11 bs=1 len=7 req=0"]))
    assert len(bad) == 1 and "2 prompts differ from upstream's own CUDA graphs" in bad[0]


def test_other_kernels_are_held_to_the_controls_distance_from_graphs_disabled():
    """FA3 captured prefill (SM90 default) against a control on FA2: per-prompt attribution between
    two kernel families means nothing, so the counts are held to the control's."""
    noise = _cell(4461, 0, 0)
    control = _cell(3881, 518, 62)
    verdict = C.judge("layerwise", _cell(3942, 458, 61), control, noise, "bf16")  # a recorded FA3 run
    assert verdict.failures == [] and verdict.targets["layerwise_real_mismatches"]["target"] == 95
    bad = _failures("layerwise", _cell(3700, 661, 100), control, noise, "bf16")
    assert len(bad) == 1 and "100 real mismatches > 95" in bad[0]
    bad = _failures("every_size", _cell(3500, 900, 61), control, noise, "bf16")
    assert len(bad) == 1 and "900/4461 near-tie flips > 777" in bad[0]
    # without a control in the process: no real mismatch, at most 10% flips
    bad = _failures("layerwise", _cell(728, 3, 1, labels=["z"]), None, _cell(732, 0, 0), "bf16")
    assert len(bad) == 1 and "no full-graph control ran" in bad[0]
    assert _failures("layerwise", _cell(600, 100, 0), None, _cell(700, 0, 0), "bf16")  # 14% flips
    # every mode, the control too: a chosen-token logprob that moves by more than the bound fails
    assert _failures("layerwise", _cell(732, 0, 0, delta=1.5), control, noise, "bf16")
    assert _failures("full", _cell(732, 0, 0, delta=1.5), None, noise, "bf16")


def test_identity_is_asserted_where_it_is_claimed():
    """The default (eager prefill attention) claims graphs disabled's tokens: one flip fails, where
    graphs disabled repeats itself; the opt-in captured attention keeps the tolerance rules."""
    noise = _cell(4461, 0, 0)
    control = _cell(3881, 518, 62)
    verdict = C.judge("layerwise", _cell(4461, 0, 0), control, noise, "bf16", identical=True)
    assert verdict.failures == [] and verdict.targets["layerwise_prompts_differing_from_disabled"] == {
        "value": 0, "target": 0, "met": True}
    bad = _failures("every_size", _cell(4460, 1, 0), control, noise, "bf16", identical=True)
    assert len(bad) == 1 and "1 prompts differ from graphs disabled (identity is claimed)" in bad[0]
    # the same counts pass the tolerance rule of the captured attention (no identity claimed)
    assert _failures("every_size", _cell(4460, 1, 0), control, noise, "bf16") == []
    # a reference that does not repeat itself cannot be matched exactly: tolerance rules apply
    assert _failures("layerwise", _cell(4459, 2, 0), control, _cell(4460, 1, 0), "bf16", identical=True) == []
    assert C.identity_claimed("layerwise", "qwen3_moe", "eager")
    assert not C.identity_claimed("layerwise", "qwen3_moe", "auto")
    assert C.identity_claimed("every_size", "deepseek_v2", "auto")  # MLA: upstream's prefill anyway
    assert not C.identity_claimed("full", "qwen3_moe", "eager")


def test_kernel_match_follows_the_captured_prefill_attention():
    assert not C.same_kernels_as_control("qwen3_moe", "eager", (9, 0))  # graphs disabled's kernels
    assert C.same_kernels_as_control("deepseek_v2", "auto", (9, 0))  # MLA keeps upstream's prefill
    assert not C.same_kernels_as_control("qwen3_moe", "auto", (9, 0))  # FA3 on SM90
    assert C.same_kernels_as_control("qwen3_moe", "auto", (12, 0))  # FA2 on SM120
    assert C.same_kernels_as_control("qwen3_moe", "fa2", (9, 0))
    assert not C.same_kernels_as_control("qwen3_moe", "fa3", (9, 0))


def test_rejudge_tool_on_the_recorded_runs(tmp_path):
    """test/gpu/rejudge_correctness.py applies judge() to results files: the whole-grid records (base
    0.5.16, H200) of qwen3_moe bf16 (FA3 default, against the control's counts) and deepseek_v2 bf16
    (MLA, equal to the control cell by cell) pass; deepseek_v2 with one layerwise cell unlike
    upstream's own graphs fails, and so would the FA3 run held to identity with its control.
    (The earlier runs this test read, e.g. deepseek_v2's failing s10 grid, are in git tag
    records-archive.)"""
    import importlib.util

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, REPO / path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    tool = load("rejudge", "test/gpu/rejudge_correctness.py")
    records = load("records_status", "benchmarks/status.py")

    def doc(name):
        return records.read_doc(REPO / "benchmarks" / "results" / f"layerwise-correctness-{name}.json.gz")

    assert all(not f for f in tool.rejudge(doc("qwen3_moe-bf16"), False).values())
    ds = doc("deepseek_v2-bf16")
    assert all(not f for f in tool.rejudge(ds, True).values())
    # the FA3 run held to identity with a control on other kernels would fail: the rule depends on it
    qw = tool.rejudge(doc("qwen3_moe-bf16"), True)
    assert any(qw[m] for m in ("layerwise", "every_size"))
    cell = next(iter(ds["modes"]["layerwise"]))
    ds["modes"]["layerwise"][cell] = dict(ds["modes"]["layerwise"][cell], flips=ds["modes"]["layerwise"][cell]["flips"] + 1)
    verdicts = tool.rejudge(ds, True)
    assert verdicts["full"] == [] and "1 cells differ from upstream's own CUDA graphs" in verdicts["layerwise"][0]
    changed = tmp_path / "layerwise-correctness-deepseek_v2-bf16.json"
    changed.write_text(json.dumps(ds))
    assert tool.main([str(changed)]) == 1
