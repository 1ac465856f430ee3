"""The tiny-model factory (sglang.sm120.tiny) and the demo launcher, on CPU.

Determinism, checkpoint layout (bf16 and ModelOpt NVFP4), quantization error bounds, loading with
transformers, the reference forward against transformers' own modeling code, and the evidence
that the GPU serving criteria can fail (docs/tiny-models.md).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang.sm120 import nvfp4
from sglang.sm120.tiny import agreement, quantize, reference
from sglang.sm120.tiny.__main__ import main as tiny_main
from sglang.sm120.tiny.build import CHECKPOINT_FILES, build, compare_scores, load_reference
from sglang.sm120.tiny.spec import ARCHS, DEEPSEEK_MOE_ARCHS, GQA_ARCHS, MLA_ARCHS, default_spec

SMALL = dict(layers=2, experts=4, top_k=2, vocab=512)


pytestmark = pytest.mark.usefixtures("one_thread")


def _sha(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Default-size NVFP4 models of every arch and a small bf16 one (built once)."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch in ARCHS:
        out[arch, "nvfp4"] = build(str(root / f"{arch}-nvfp4"), default_spec(arch, "nvfp4"),
                                   log=lambda m: None)
        out[arch, "bf16-small"] = build(str(root / f"{arch}-bf16-small"),
                                        default_spec(arch, "bf16", **SMALL), log=lambda m: None)
    return out


# ----------------------------------------------------------------------------- options

@pytest.mark.parametrize("argv, option", [
    (["--hidden", "200"], "--hidden"),
    (["--moe-intermediate", "100"], "--moe-intermediate"),
    (["--top-k", "0"], "--top-k"),
    (["--experts", "1"], "--experts"),
    (["--vocab", "100"], "--vocab"),
    (["--seed", "-1"], "--seed"),
    (["--layers", "0"], "--layers"),
])
def test_bad_options_fail_with_one_line_naming_the_option(tmp_path, capsys, argv, option):
    rc = tiny_main(["--arch", "qwen3_moe", "--out", str(tmp_path / "m")] + argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith(f"error: {option}:") and "\n" not in err, err
    assert not (tmp_path / "m").exists()


def test_refuses_non_empty_out_without_force(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("x")
    assert tiny_main(["--arch", "qwen3_moe", "--out", str(tmp_path / "m")] + _small_argv()) == 2
    assert "--out" in capsys.readouterr().err
    assert (tmp_path / "m" / "keep.txt").exists()


def _small_argv():
    return ["--layers", "2", "--experts", "4", "--top-k", "2", "--vocab", "512"]


# ----------------------------------------------------------------------------- determinism

@pytest.mark.parametrize("arch, quant", [("deepseek_v2", "bf16"), ("deepseek_v2", "nvfp4"),
                                         ("glm_moe_dsa", "nvfp4"), ("glm4_moe", "nvfp4")])
def test_bytes_are_deterministic_for_a_seed_and_differ_across_seeds(tmp_path, arch, quant):
    files = list(CHECKPOINT_FILES) + (["hf_quant_config.json"] if quant == "nvfp4" else [])
    dirs = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert tiny_main(["--arch", arch, "--quant", quant, "--seed", str(seed),
                          "--out", str(tmp_path / name)] + _small_argv()) == 0
        dirs.append(str(tmp_path / name))
    a, b, c = dirs
    assert {f: _sha(a, f) for f in files} == {f: _sha(b, f) for f in files}
    assert _sha(a, "model.safetensors") != _sha(c, "model.safetensors")
    assert _sha(a, "tokenizer.json") == _sha(c, "tokenizer.json")  # tokenizer is seed-free
    ra, rb = load_reference(a), load_reference(b)
    assert ra["eval"]["sequences"] == rb["eval"]["sequences"]
    for mode, sa in ra["eval"]["scores"].items():
        res = compare_scores(sa, rb["eval"]["scores"][mode])
        assert res["top1"] == 1.0 and res["corr"] > 1 - 1e-9


# ----------------------------------------------------------------------------- layout

def _expected_bf16_names(spec):
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(spec.layers):
        p = f"model.layers.{i}"
        names |= {f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"}
        a = f"{p}.self_attn"
        if spec.arch == "qwen3_moe":
            names |= {f"{a}.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        elif spec.arch == "glm4_moe":
            names |= {f"{a}.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
            names |= {f"{a}.{n}.bias" for n in ("q_proj", "k_proj", "v_proj")}
        else:
            names |= {f"{a}.{n}.weight" for n in ("q_a_proj", "q_a_layernorm", "q_b_proj",
                                                  "kv_a_proj_with_mqa", "kv_a_layernorm",
                                                  "kv_b_proj", "o_proj")}
        if spec.arch == "glm_moe_dsa":
            names |= {f"{a}.indexer.{n}.weight" for n in ("wq_b", "wk", "k_norm", "weights_proj")}
            names.add(f"{a}.indexer.k_norm.bias")
        mlp = ("gate_proj", "up_proj", "down_proj")
        if spec.arch in DEEPSEEK_MOE_ARCHS and i < spec.dense_layers:
            names |= {f"{p}.mlp.{n}.weight" for n in mlp}
            continue
        names.add(f"{p}.mlp.gate.weight")
        names |= {f"{p}.mlp.experts.{e}.{n}.weight" for e in range(spec.experts) for n in mlp}
        if spec.arch in DEEPSEEK_MOE_ARCHS:
            names.add(f"{p}.mlp.gate.e_score_correction_bias")
            names |= {f"{p}.mlp.shared_experts.{n}.weight" for n in mlp}
    return names


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_checkpoint_layout(models, arch):
    d = models[arch, "bf16-small"]
    spec = default_spec(arch, "bf16", **SMALL)
    t = load_file(os.path.join(d, "model.safetensors"))
    assert set(t) == _expected_bf16_names(spec)
    for name, v in t.items():
        want = torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16
        assert v.dtype == want, name
    assert t["lm_head.weight"].shape == (spec.vocab, spec.hidden)
    assert not os.path.exists(os.path.join(d, "hf_quant_config.json"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["torch_dtype"] == "bfloat16" and "quantization_config" not in cfg


@pytest.mark.parametrize("arch", ARCHS)
def test_nvfp4_checkpoint_layout(models, arch):
    d = models[arch, "nvfp4"]
    spec = default_spec(arch, "nvfp4")
    t = load_file(os.path.join(d, "model.safetensors"))
    groups = quantize.quant_groups(spec)
    quantized = {m for g in groups for m in g.members}
    expected = set()
    for name in _expected_bf16_names(spec):
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod is None and name.endswith(".bias"):  # a quantized linear keeps its bias in bf16
            expected.add(name)
            continue
        if mod in quantized:
            expected |= {f"{mod}.{k}" for k in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
        else:
            expected.add(name)
    assert set(t) == expected

    for m in quantized:
        n, k = _bf16_shape(spec, m)
        assert t[m + ".weight"].dtype == torch.uint8 and t[m + ".weight"].shape == (n, k // 2), m
        assert t[m + ".weight_scale"].dtype == torch.float8_e4m3fn, m
        assert t[m + ".weight_scale"].shape == (n, k // 16), m
        for s in ("weight_scale_2", "input_scale"):
            assert t[f"{m}.{s}"].dtype == torch.float32 and t[f"{m}.{s}"].dim() == 0, (m, s)
            assert float(t[f"{m}.{s}"]) > 0
    for g in groups:  # fused members share both global scales
        for s in ("weight_scale_2", "input_scale"):
            vals = {float(t[f"{m}.{s}"]) for m in g.members}
            assert len(vals) == 1, (g.members, s, vals)

    # what stays bf16, and the quant config sglang reads
    for name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
        assert t[name].dtype == torch.bfloat16
    moe_layer = spec.dense_layers if arch in DEEPSEEK_MOE_ARCHS else 0
    assert t[f"model.layers.{moe_layer}.mlp.gate.weight"].dtype == torch.bfloat16
    if arch in MLA_ARCHS:  # attention (and GLM-5's indexer with it) stays bf16
        attn = [n for n in t if ".self_attn." in n]
        assert attn and all(t[n].dtype == torch.bfloat16 for n in attn)
    if arch == "glm_moe_dsa":
        assert t["model.layers.0.self_attn.indexer.wq_b.weight"].dtype == torch.bfloat16
    if arch == "glm4_moe":  # q/k/v quantized, their biases bf16
        assert t["model.layers.0.self_attn.q_proj.weight"].dtype == torch.uint8
        assert t["model.layers.0.self_attn.q_proj.bias"].dtype == torch.bfloat16
    hq = json.load(open(os.path.join(d, "hf_quant_config.json")))["quantization"]
    assert hq["quant_algo"] == "NVFP4" and hq["group_size"] == 16
    assert "lm_head" in hq["exclude_modules"]
    assert ("model.layers.*.self_attn*" in hq["exclude_modules"]) == (arch in MLA_ARCHS)
    assert "quantization_config" not in json.load(open(os.path.join(d, "config.json")))


def _bf16_shape(spec, module):
    w = _default_weights(spec.arch)
    return tuple(w[module + ".weight"].shape)


_WEIGHTS = {}


def _default_weights(arch):
    if arch not in _WEIGHTS:
        from sglang.sm120.tiny.weights import init_weights
        _WEIGHTS[arch] = init_weights(default_spec(arch, "nvfp4"))
    return _WEIGHTS[arch]


# Bound for one element: the block scale is amax/6 rounded to e4m3 (<= 1/16 relative error),
# and e2m1 steps are at most 2 scale units apart (4 -> 6), so |error| <= 1 scale unit
# <= (17/16) * amax_block / 6. Over a whole random matrix the RMS error is ~9-10% of the RMS
# weight; 12% is the documented limit.
ELEMENT_BOUND = 17.0 / 16.0 / 6.0
RELATIVE_RMS_BOUND = 0.12


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_dequantize_error_bound(models, arch):
    t = load_file(os.path.join(models[arch, "nvfp4"], "model.safetensors"))
    w = _default_weights(arch)
    worst_rel = 0.0
    for g in quantize.quant_groups(default_spec(arch, "nvfp4")):
        for m in g.members:
            orig = w[m + ".weight"].float()
            deq = nvfp4.dequantize_weight_modelopt(t[m + ".weight"], t[m + ".weight_scale"],
                                                   t[m + ".weight_scale_2"])
            err = (deq - orig).abs().reshape(orig.shape[0], -1, 16)
            block_amax = orig.abs().reshape(orig.shape[0], -1, 16).amax(-1, keepdim=True)
            assert bool((err <= ELEMENT_BOUND * block_amax + 1e-12).all()), m
            rel = float((deq - orig).pow(2).mean().sqrt() / orig.pow(2).mean().sqrt())
            worst_rel = max(worst_rel, rel)
    assert worst_rel < RELATIVE_RMS_BOUND, worst_rel


@pytest.mark.parametrize("arch", ARCHS)
def test_input_scales_come_from_calibration_with_headroom(models, arch):
    d = models[arch, "nvfp4"]
    spec = default_spec(arch, "nvfp4")
    t = load_file(os.path.join(d, "model.safetensors"))
    ref = load_reference(d)
    from sglang.sm120.tiny.build import calibrate
    from sglang.sm120.tiny.tokenizer import build_tokenizer
    raw = calibrate(spec, _default_weights(arch), build_tokenizer(spec.vocab))
    for g in quantize.quant_groups(spec):
        rounded = ref["calibration_amax_rounded"][g.input_key]
        assert math.log2(rounded) == int(math.log2(rounded))  # a power of two
        assert 2 * raw[g.input_key] <= rounded < 4 * raw[g.input_key]
        # input_scale encodes that amax: amax / (6 * 448), in fp32
        assert float(t[g.members[0] + ".input_scale"]) * 6 * 448 == pytest.approx(rounded, rel=1e-6)


# ----------------------------------------------------------------------------- transformers

@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_config_and_tokenizer_with_chat_template(models, arch):
    from transformers import AutoConfig, AutoTokenizer

    d = models[arch, "nvfp4"]
    cfg = AutoConfig.from_pretrained(d)
    spec = default_spec(arch, "nvfp4")
    assert cfg.vocab_size == spec.vocab and cfg.hidden_size == spec.hidden
    if arch == "qwen3_moe":
        assert cfg.model_type == "qwen3_moe" and cfg.num_experts == spec.experts
    elif arch == "glm4_moe":
        assert cfg.model_type == "glm4_moe" and cfg.n_routed_experts == spec.experts
        assert cfg.attention_bias is True and cfg.use_qk_norm is False
        assert cfg.first_k_dense_replace == spec.dense_layers and cfg.n_shared_experts == 1
    else:
        assert cfg.model_type == {"deepseek_v2": "deepseek_v3", "glm_moe_dsa": "glm_moe_dsa"}[arch]
        assert cfg.n_routed_experts == spec.experts
        # keys sglang reads that transformers' class does not declare must survive loading
        assert (cfg.topk_method, cfg.scoring_func, cfg.moe_layer_freq) == ("noaux_tc", "sigmoid", 1)
        assert cfg.kv_lora_rank == 512 and cfg.qk_rope_head_dim == 64
    if arch == "glm_moe_dsa":
        assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (32, 128, 2048)
        # sglang's own predicates pick the DSA path for this config
        from sglang.srt.configs.model_config import get_dsa_index_topk, is_deepseek_dsa
        assert is_deepseek_dsa(cfg) and get_dsa_index_topk(cfg) == 2048
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) == cfg.vocab_size
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|bos|><|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:2] == [tok.bos_token_id, tok.convert_tokens_to_ids("<|im_start|>")]
    s = "Water boils at 100 degrees, naïve café ✓"
    assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    gen = json.load(open(os.path.join(d, "generation_config.json")))
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]


@pytest.mark.parametrize("arch", ARCHS)
def test_reference_forward_matches_transformers_modeling(models, arch):
    """transformers loads the bf16 checkpoint with no missing or unexpected weights and computes
    the same logits as the reference forward the factory calibrates and scores with."""
    from transformers import AutoModelForCausalLM

    d = models[arch, "bf16-small"]
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                      output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ref = load_reference(d)
    ids = torch.tensor(ref["eval"]["sequences"][0])
    with torch.no_grad():
        hf = model(ids[None]).logits[0]
    mine = reference.TinyForward(default_spec(arch, "bf16", **SMALL),
                                 load_file(os.path.join(d, "model.safetensors")))(ids)
    assert (hf - mine).abs().max() < 1e-3 * hf.abs().max()
    assert bool((hf.argmax(-1) == mine.argmax(-1)).all())


def test_dsa_reference_applies_the_indexer_top_k_like_transformers(tmp_path):
    """With index_topk below the sequence length the reference keeps each query's top-k keys by
    the indexer score, as transformers' GlmMoeDsa does; dense attention is then far off (so the
    check can fail), and at the default index_topk (2048) the reference is dense."""
    from transformers import AutoModelForCausalLM
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as M

    # transformers hard-codes the indexer's RoPE pairing (half-split up to 5.12, interleaved from
    # 5.19); the model says which in indexer_rope_interleave, which the reference follows
    interleaved = "apply_rotary_pos_emb_interleave(q_rot" in inspect.getsource(M.GlmMoeDsaIndexer.forward)
    spec = default_spec("glm_moe_dsa", "bf16", **SMALL).replace(index_topk=8, indexer_rope_interleave=interleaved)
    d = build(str(tmp_path / "dsa"), spec, log=lambda m: None)
    ids = torch.tensor(load_reference(d)["eval"]["sequences"][0])
    assert ids.numel() > 4 * spec.index_topk
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    with torch.no_grad():
        hf = model(ids[None]).logits[0]
    w = load_file(os.path.join(d, "model.safetensors"))
    sparse = reference.TinyForward(spec, w)(ids)
    dense = reference.TinyForward(spec.replace(index_topk=2048), w)(ids)
    scale = hf.abs().max()
    assert (hf - sparse).abs().max() < 1e-3 * scale
    assert (hf - dense).abs().max() > 0.1 * scale
    # the first index_topk positions see at most index_topk keys: sparse == dense there
    k = spec.index_topk
    assert (sparse[:k] - dense[:k]).abs().max() < 1e-5 * scale


# ----------------------------------------------------------------------------- criteria

@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_of_the_random_model_is_not_degenerate(models, arch):
    d = models[arch, "nvfp4"]
    ref = load_reference(d)
    w = _default_weights(arch)
    out = reference.greedy(reference.TinyForward(default_spec(arch, "nvfp4"), w),
                           ref["eval"]["sequences"][0][:8], 16)
    assert len(set(out)) >= 6, out
    s = ref["eval"]["summary"]
    # the model is built so NVFP4 error stays well below the signal (see weights.py)
    assert s["nvfp4_w4a16_vs_bf16"]["corr"] > 0.95 and s["nvfp4_w4a16_vs_bf16"]["top1"] > 0.5, s
    assert s["nvfp4_w4a4_vs_bf16"]["corr"] > 0.93, s


def _corrupt(t, how):
    t = dict(t)
    for name in [n for n in t if n.endswith(".weight") and t[n].dtype == torch.uint8]:
        m = name[: -len(".weight")]
        if how == "nibbles":
            t[name] = ((t[name] & 0xF) << 4) | (t[name] >> 4)
        elif how == "up_scale" and m.endswith("up_proj"):
            t[m + ".weight_scale_2"] = t[m + ".weight_scale_2"] * 1.5
        elif how == "experts_zero" and ".experts." in m:
            t[name] = torch.zeros_like(t[name])
    return t


@pytest.mark.parametrize("arch", ARCHS)
def test_serving_criteria_reject_broken_nvfp4_checkpoints(models, arch):
    """What the GPU tests assert, applied to deliberately corrupted checkpoints: each fails
    both the reference match and the bf16 tracking limits, while the intact one passes."""
    d = models[arch, "nvfp4"]
    spec = default_spec(arch, "nvfp4")
    ref = load_reference(d)
    t = load_file(os.path.join(d, "model.safetensors"))
    seqs = ref["eval"]["sequences"]
    limits = agreement.tracking_limits(ref["eval"]["summary"]["nvfp4_w4a16_vs_bf16"])
    from sglang.sm120.tiny.build import score_sequences
    probes = ref["eval"]["probe_ids"]
    for how in ("intact", "nibbles", "up_scale", "experts_zero"):
        tc = t if how == "intact" else _corrupt(t, how)
        got = score_sequences(reference.TinyForward(spec, tc, quantize.NVFP4Linears(tc, False)), seqs, probes)
        vs_ref = agreement.check(compare_scores(got, ref["eval"]["scores"]["w4a16"]),
                                 agreement.REFERENCE_MIN_TOP1, agreement.REFERENCE_MAX_DECORRELATION)
        vs_bf16 = agreement.check(compare_scores(got, ref["eval"]["scores"]["bf16"]),
                                  limits["min_top1"], limits["max_decorrelation"])
        if how == "intact":
            assert not vs_ref and not vs_bf16, (vs_ref, vs_bf16)
        else:
            assert vs_ref and vs_bf16, (how, vs_ref, vs_bf16)


def test_unrelated_model_fails_the_reference_match(models):
    """A different seed (same arch, same tokenizer) scores near zero agreement."""
    a = load_reference(models["deepseek_v2", "bf16-small"])
    spec = default_spec("deepseek_v2", "bf16", seed=1, **SMALL)
    from sglang.sm120.tiny.build import score_sequences
    from sglang.sm120.tiny.weights import init_weights
    got = score_sequences(reference.TinyForward(spec, init_weights(spec)), a["eval"]["sequences"],
                  a["eval"]["probe_ids"])
    res = compare_scores(got, a["eval"]["scores"]["bf16"])
    assert res["corr"] < 0.3 and res["top1"] < 0.2, res


def test_serving_targets_from_recorded_results():
    """The GPU serving summary's `targets`: every recorded criterion, met or missed."""
    models = {
        "a-bf16": {"ready_s": 100.0, "greedy_repeat_identical": True,
                   "vs_reference_bf16": {"top1": 0.99, "corr": 0.9999, "positions": 10},
                   "shutdown": {"clean": True}},
        "a-nvfp4": {"ready_s": 110.0, "greedy_repeat_identical": False,
                    "vs_reference_w4a16": {"top1": 0.80, "corr": 0.999, "positions": 10},
                    "vs_bf16": {"top1": 0.6, "corr": 0.95, "positions": 10,
                                "limits": {"min_top1": 0.55, "max_decorrelation": 0.03}},
                    "shutdown": {"clean": False}},
        "b-bf16": {},  # never became ready
    }
    t = agreement.serving_targets(models)
    assert t["a-bf16_vs_reference_bf16_top1"]["met"] and t["a-bf16_shutdown_clean"]["met"]
    assert t["a-bf16_greedy_repeat_identical"]["met"]
    assert not t["a-nvfp4_vs_reference_w4a16_top1"]["met"]
    assert t["a-nvfp4_vs_reference_w4a16_decorrelation"]["met"]
    assert t["a-nvfp4_vs_bf16_top1"]["met"] and not t["a-nvfp4_vs_bf16_decorrelation"]["met"]
    assert not t["a-nvfp4_greedy_repeat_identical"]["met"] and not t["a-nvfp4_shutdown_clean"]["met"]
    assert t["b-bf16_started"] == {"value": None, "target": "ready (s)", "met": False}
    assert "b-bf16_shutdown_clean" not in t
