"""Serve each tiny model (bf16 and NVFP4; qwen3_moe, deepseek_v2, glm_moe_dsa, glm4_moe) with sglang
and check it.

Run on a GPU host with the fork installed:
    PYTHONPATH=/tmp/site python3 -m pytest -m gpu -q test/gpu/test_serving_tiny.py
Thresholds and their derivation: docs/tiny-models.md ("Serving tests").
Selecting: the ids are "<arch>-<quant>" and no test name contains a quant, so `-k bf16` starts
only bf16 servers, `-k nvfp4` only NVFP4 ones, `-k glm_moe_dsa` both of that arch.
"""
from __future__ import annotations

import time

import pytest

from sglang.sm120 import launcher
from sglang.sm120.tiny.serving import TINY_MODELS

pytestmark = pytest.mark.gpu

MODELS = TINY_MODELS
NVFP4_MODELS = [m for m in MODELS if m.endswith("-nvfp4")]
GEN_TOKENS = 16


def _all(ids):
    return pytest.mark.parametrize("server", ids, indirect=True)


def _generate(srv, payload, timeout=300.0):
    return launcher.request_json(srv.url + "/generate", payload, timeout=timeout)


def _reference(srv):
    from sglang.sm120.tiny.build import load_reference
    return load_reference(srv.model_dir)


def _served_scores(srv, ref):
    """Teacher-forced scores of the EVAL sequences from the server: per position the argmax
    next token and the logprobs of the probe ids (same layout as tiny_reference.json)."""
    seqs = ref["eval"]["sequences"]
    probes = ref["eval"]["probe_ids"]
    out = _generate(srv, {
        "input_ids": seqs,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 1,
        "token_ids_logprob": [list(probes) for _ in seqs],
    })
    assert isinstance(out, list) and len(out) == len(seqs), f"batch /generate returned {type(out)}"
    top1, probe_lp = [], []
    for seq, r in zip(seqs, out):
        mi = r["meta_info"]
        tops, ids_lp = mi["input_top_logprobs"], mi["input_token_ids_logprobs"]
        # entry i scores token i given tokens < i; entry 0 has nothing to score
        if len(tops) == len(seq):
            tops, ids_lp = tops[1:], ids_lp[1:]
        assert len(tops) == len(seq) - 1 == len(ids_lp), (
            f"expected {len(seq) - 1} input logprob positions, got {len(tops)} / {len(ids_lp)}")
        top1.append([int(t[0][1]) for t in tops])
        rows = []
        for entry in ids_lp:
            by_id = {int(tid): float(lp) for lp, tid, _ in entry}
            rows.append([by_id[p] for p in probes])
        probe_lp.append(rows)
    return {"top1": top1, "probe_logprobs": probe_lp}


def _capability_major() -> int:
    import torch
    return torch.cuda.get_device_capability()[0]


@_all(MODELS)
def test_generate_greedy_is_deterministic(server, serving):
    from sglang.sm120.tiny.prompts import GENERATE_PROMPTS

    payload = {"text": list(GENERATE_PROMPTS),
               "sampling_params": {"max_new_tokens": GEN_TOKENS, "temperature": 0.0,
                                   "ignore_eos": True}}
    t = time.time()
    first = _generate(server, payload)
    serving.say(f"{server.name}: first /generate batch in {time.time() - t:.1f}s")
    second = _generate(server, payload)
    single = [_generate(server, {"text": p, "sampling_params": payload["sampling_params"]})
              for p in GENERATE_PROMPTS[:1]]
    serving.record(server.name, "greedy_repeat_identical",
                   [r["output_ids"] for r in first] == [r["output_ids"] for r in second])
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in second]
    assert [r["text"] for r in first] == [r["text"] for r in second]
    for r in first:
        assert len(r["output_ids"]) == GEN_TOKENS, r["meta_info"]
        assert r["meta_info"]["finish_reason"]["type"] == "length", r["meta_info"]
    # a healthy random model does not collapse onto one token
    distinct = {t for r in first for t in r["output_ids"]}
    assert len(distinct) >= 8, f"only {len(distinct)} distinct tokens in {len(first)} outputs"
    serving.record(server.name, "greedy_texts", [r["text"] for r in first])
    serving.record(server.name, "single_vs_batch_same",
                   single[0]["output_ids"] == first[0]["output_ids"])


@_all(MODELS)
def test_chat_completion_is_well_formed(server, serving):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "Name a color and an animal."}]
    body = {"model": server.name, "messages": messages, "max_tokens": 12, "temperature": 0.0}
    r = launcher.request_json(server.url + "/v1/chat/completions", body, timeout=300.0)
    again = launcher.request_json(server.url + "/v1/chat/completions", body, timeout=300.0)
    assert r["object"] == "chat.completion", r
    assert r["model"] == server.name, r
    assert len(r["choices"]) == 1, r
    choice = r["choices"][0]
    assert choice["message"]["role"] == "assistant", choice
    assert isinstance(choice["message"]["content"], str), choice
    assert choice["finish_reason"] in ("stop", "length"), choice
    usage = r["usage"]
    assert 1 <= usage["completion_tokens"] <= 12, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    # the server applied the model's chat template: same prompt length as templating locally
    tok = AutoTokenizer.from_pretrained(server.model_dir)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert usage["prompt_tokens"] == len(tok.encode(text, add_special_tokens=False)), (usage, text)
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    models = launcher.request_json(server.url + "/v1/models")
    assert server.name in [m["id"] for m in models["data"]], models
    serving.record(server.name, "chat_content", choice["message"]["content"])


@_all(MODELS)
def test_matches_cpu_reference(server, serving):
    """The server computes the same function as the CPU reference forward of its weights:
    proves sglang loads the checkpoint as intended (names, layouts, NVFP4 scales)."""
    from sglang.sm120.tiny import agreement
    from sglang.sm120.tiny.build import compare_scores

    ref = _reference(server)
    mode = "bf16"
    if server.name.endswith("-nvfp4"):
        mode = agreement.nvfp4_mode_for_capability(_capability_major())
    served = _served_scores(server, ref)
    serving.scores[server.name] = served
    res = compare_scores(served, ref["eval"]["scores"][mode])
    serving.say(f"{server.name}: vs CPU reference ({mode}): top1 {res['top1']:.3f}, "
                f"corr {res['corr']:.5f} over {res['positions']} positions")
    serving.record(server.name, f"vs_reference_{mode}", res)
    bad = agreement.check(res, agreement.REFERENCE_MIN_TOP1, agreement.REFERENCE_MAX_DECORRELATION)
    assert not bad, f"{server.name} differs from the CPU reference ({mode}): {'; '.join(bad)}"


@_all(NVFP4_MODELS)
def test_nvfp4_tracks_unquantized(server, serving):
    """NVFP4 output tracks bf16 output within the bound set by the CPU estimate of the same
    comparison. Compared with the bf16 server of the same arch when it ran in this session,
    otherwise with the bf16 CPU reference."""
    from sglang.sm120.tiny import agreement
    from sglang.sm120.tiny.build import compare_scores

    ref = _reference(server)
    mode = agreement.nvfp4_mode_for_capability(_capability_major())
    served = serving.scores.get(server.name) or _served_scores(server, ref)
    bf16_name = server.name.replace("-nvfp4", "-bf16")
    bf16_scores = serving.scores.get(bf16_name)
    against = f"{bf16_name} server"
    if bf16_scores is None:
        bf16_scores, against = ref["eval"]["scores"]["bf16"], "bf16 CPU reference"
    res = compare_scores(served, bf16_scores)
    simulated = ref["eval"]["summary"][f"nvfp4_{mode}_vs_bf16"]
    limits = agreement.tracking_limits(simulated)
    serving.say(f"{server.name}: vs {against}: top1 {res['top1']:.3f} (min {limits['min_top1']:.3f}), "
                f"decorrelation {1 - res['corr']:.4f} (max {limits['max_decorrelation']:.4f}); "
                f"CPU estimate top1 {simulated['top1']:.3f} corr {simulated['corr']:.4f}")
    serving.record(server.name, "vs_bf16", {"against": against, **res, "limits": limits,
                                            "simulated": simulated})
    bad = agreement.check(res, limits["min_top1"], limits["max_decorrelation"])
    assert not bad, f"{server.name} does not track bf16 ({against}): {'; '.join(bad)}"


@_all(MODELS)
def test_shutdown_is_clean(server, serving):
    """Last test per model: SIGTERM stops every process of the server and frees its port."""
    report = server.stop()
    serving.record(server.name, "shutdown", report.__dict__)
    serving.say(f"{server.name}: shutdown {report.seconds:.1f}s, clean={report.clean}")
    assert report.clean, (f"{server.name}: unclean shutdown {report}; log tail:\n"
                          f"{launcher.log_tail(server.log_path)}")
