"""Full-size NVFP4 checkpoints (sglang.sm120.tiny.fullsize), checked on CPU at small sizes: the same
tensors, dtypes and config as the tiny factory's NVFP4 model of the same spec, shards and index,
the padded LM head, the fixed input scales, reuse, and the real Qwen3-30B-A3B shapes."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sglang.sm120 import nvfp4
from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG
from sglang.sm120.tiny import fullsize, quantize
from sglang.sm120.tiny.build import build
from sglang.sm120.tiny.spec import default_spec, hf_config

SPEC = default_spec("qwen3_moe", "nvfp4", layers=3, experts=4, top_k=2, vocab=1024)
TOKENIZER_VOCAB = 512


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("fullsize")
    full = fullsize.build_fullsize(str(root / "full"), SPEC, "cpu", TOKENIZER_VOCAB, layers_per_shard=2,
                                   log=lambda m: None)
    tiny = build(str(root / "tiny"), SPEC, log=lambda m: None)
    return full, tiny


def _tensors(d):
    idx = json.load(open(os.path.join(d, fullsize.INDEX_FILE)))
    out, where = {}, {}
    for f in sorted(set(idx["weight_map"].values())):
        part = load_file(os.path.join(d, f))
        out.update(part)
        where.update({k: f for k in part})
    return idx, out, where


def test_same_tensors_and_config_as_the_tiny_nvfp4_model(built):
    full, tiny = built
    _, ft, _ = _tensors(full)
    tt = load_file(os.path.join(tiny, "model.safetensors"))
    assert sorted(ft) == sorted(tt)
    diff = [k for k in tt if (ft[k].shape, ft[k].dtype) != (tt[k].shape, tt[k].dtype)]
    assert not diff
    for f in ("config.json", "generation_config.json"):
        assert json.load(open(os.path.join(full, f))) == json.load(open(os.path.join(tiny, f)))
    q_full = json.load(open(os.path.join(full, "hf_quant_config.json")))["quantization"]
    assert q_full == json.load(open(os.path.join(tiny, "hf_quant_config.json")))["quantization"]


def test_shards_and_index(built):
    full, _ = built
    idx, t, where = _tensors(full)
    assert idx["weight_map"] == where
    assert idx["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in t.values())
    shards = sorted(set(where.values()))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]  # 2 + 1 layers, then the head
    assert where["model.embed_tokens.weight"] == shards[0] and where["lm_head.weight"] == shards[2]
    assert where["model.layers.2.mlp.experts.3.down_proj.weight"] == shards[1]


def test_lm_head_rows_past_the_tokenizer_are_zero_and_scales_are_fixed(built):
    full, _ = built
    _, t, _ = _tensors(full)
    head = t["lm_head.weight"]
    assert head.shape[0] == SPEC.vocab and not head[TOKENIZER_VOCAB:].any()
    assert bool((head[:TOKENIZER_VOCAB].abs().sum(1) > 0).all())
    tok = json.load(open(os.path.join(full, "tokenizer.json")))
    assert len(tok["model"]["vocab"]) == TOKENIZER_VOCAB
    want = {k: float(nvfp4.input_scale_from_amax(quantize.rounded_amax(a))) for k, a in fullsize.FIXED_INPUT_AMAX.items()}
    assert float(t["model.layers.0.self_attn.k_proj.input_scale"]) == want["q_proj"]
    assert float(t["model.layers.1.mlp.experts.2.up_proj.input_scale"]) == want["w13"]
    assert float(t["model.layers.1.mlp.experts.2.down_proj.input_scale"]) == want["w2"]
    for k in [k for k in t if k.endswith(".weight_scale")][:20]:
        assert torch.isfinite(t[k].float()).all() and t[k].float().max() > 0


def test_quantized_weights_follow_the_init_rules(built):
    """Dequantized expert weights have the std the init rules give (1/sqrt(K), 0.7/sqrt(K) for
    down_proj): the quantizer saw real random weights, not zeros or garbage."""
    full, _ = built
    _, t, _ = _tensors(full)
    p = "model.layers.1.mlp.experts.0"
    for name, gain in (("gate_proj", 1.0), ("down_proj", 0.7)):
        w = nvfp4.dequantize_weight_modelopt(t[f"{p}.{name}.weight"], t[f"{p}.{name}.weight_scale"],
                                             t[f"{p}.{name}.weight_scale_2"])
        want = gain / w.shape[1] ** 0.5
        assert abs(w.std().item() / want - 1) < 0.1


def test_reuse_and_spec_matching(built, tmp_path, capsys, monkeypatch):
    full, _ = built
    assert fullsize.matches(full, SPEC) and not fullsize.matches(full, SPEC.replace(seed=1))
    d = tmp_path / "preset"
    d.mkdir()
    preset = fullsize.preset_spec("qwen3-30b-a3b")
    (d / fullsize.INFO_FILE).write_text(json.dumps({"format_version": fullsize.FORMAT_VERSION, "spec": preset.to_dict()}))
    assert fullsize.main(["--out", str(d), "--reuse"]) == 0
    assert "reusing" in capsys.readouterr().err and sorted(os.listdir(d)) == [fullsize.INFO_FILE]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fullsize.main(["--out", str(d), "--reuse", "--layers", "2"]) == 2  # another spec: would build, on cuda
    assert "--device cuda" in capsys.readouterr().err


def test_bad_options_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="--tokenizer-vocab"):
        fullsize.build_fullsize(str(tmp_path / "x"), SPEC, "cpu", tokenizer_vocab=2048)
    with pytest.raises(ValueError, match="--layers-per-shard"):
        fullsize.build_fullsize(str(tmp_path / "x"), SPEC, "cpu", TOKENIZER_VOCAB, layers_per_shard=0)
    with pytest.raises(ValueError, match="--hidden"):
        fullsize.build_fullsize(str(tmp_path / "x"), SPEC.replace(hidden=200), "cpu", TOKENIZER_VOCAB)


def test_preset_has_qwen3_30b_a3b_shapes():
    s = fullsize.preset_spec("qwen3-30b-a3b")
    cfg = hf_config(s, {"bos": 1, "eos": 2, "pad": 3})
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                "vocab_size", "max_position_embeddings", "rope_theta", "norm_topk_prob"):
        assert cfg[key] == QWEN3_30B_A3B_CONFIG[key], key
    fullsize.validate(s, fullsize.MAX_VOCAB)
    assert 16.5 < fullsize.checkpoint_gb(s) < 18.5
