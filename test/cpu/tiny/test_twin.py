"""The GLM-5 rank twin's config writer (sglang.sm120.tiny.twin) and its router hook
(sglang.sm120.tiny.twin_router), on CPU: shapes, exclude list, byte count, spread, probes."""
from __future__ import annotations

import json
import os
import types

import pytest
import torch

from sglang.sm120.tiny import twin, twin_router

GIB = 2**30


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = {}
    for v in twin.VARIANTS:
        d = tmp_path_factory.mktemp(v)
        twin.write(str(d), v)
        out[v] = d
    return out


def test_config_has_one_tp8_rank_of_glm5(written):
    cfg = json.loads((written["experts-fp4"] / "config.json").read_text())
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["model_type"] == "glm_moe_dsa"
    expect = {"hidden_size": 6144, "num_hidden_layers": 78, "first_k_dense_replace": 3,
              "intermediate_size": 12288 // 8, "num_attention_heads": 64 // 8, "num_key_value_heads": 64 // 8,
              "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
              "v_head_dim": 256, "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
              "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048 // 8,
              "n_shared_experts": 1, "vocab_size": 154880 // 8, "scoring_func": "sigmoid",
              "topk_method": "noaux_tc", "routed_scaling_factor": 2.5}
    assert {k: cfg[k] for k in expect} == expect
    assert (written["experts-fp4"] / "tokenizer.json").exists()
    assert not any(f.endswith(".safetensors") for f in os.listdir(written["experts-fp4"]))


def test_exclude_list_keeps_attention_dense_shared_lm_head_indexer_bf16(written):
    q = json.loads((written["experts-fp4"] / "hf_quant_config.json").read_text())["quantization"]
    assert q["quant_algo"] == "NVFP4" and q["group_size"] == 16
    ex = q["exclude_modules"]
    kept = ["lm_head", "model.layers.5.mlp.gate", "model.layers.5.self_attn.q_a_proj",
            "model.layers.5.self_attn.kv_b_proj", "model.layers.5.self_attn.o_proj",
            "model.layers.5.self_attn.indexer.wq_b", "model.layers.5.self_attn.indexer.weights_proj",
            "model.layers.0.mlp.gate_proj", "model.layers.2.mlp.down_proj",
            "model.layers.40.mlp.shared_experts.up_proj"]
    assert all(twin.is_excluded(n, ex) for n in kept), [n for n in kept if not twin.is_excluded(n, ex)]
    assert not twin.is_excluded("model.layers.3.mlp.experts.17.gate_proj", ex)
    assert not twin.is_excluded("model.layers.77.mlp.experts.*.down_proj", ex)


def test_all_fp4_quantizes_every_linear_sglang_can_run_in_fp4():
    ex = twin.exclude_modules("all-fp4")
    for n in ("model.layers.5.self_attn.q_a_proj", "model.layers.5.self_attn.o_proj", "model.layers.0.mlp.up_proj",
              "model.layers.40.mlp.shared_experts.down_proj", "model.layers.3.mlp.experts.0.up_proj"):
        assert not twin.is_excluded(n, ex), n
    for n in ("lm_head", "model.layers.5.mlp.gate", "model.layers.5.self_attn.kv_b_proj",
              "model.layers.5.self_attn.indexer.wk"):
        assert twin.is_excluded(n, ex), n


def test_exclude_patterns_match_as_upstream_matches_them():
    """Our fnmatch classification agrees with upstream ModelOpt's is_layer_excluded."""
    from sglang.srt.layers.quantization import modelopt_quant

    for v in twin.VARIANTS:
        ex = twin.exclude_modules(v)
        fake = types.SimpleNamespace(exclude_modules=ex)
        checked = 0
        for t in twin.tensors(twin.rank_shapes()):
            if t.linear and (".layers.1." in t.name or ".layers.50." in t.name or t.name == "lm_head.weight"):
                name = t.name.replace("experts.*.", "experts.0.")
                assert modelopt_quant.ModelOptFp4Config.is_layer_excluded(fake, name) == twin.is_excluded(t.name, ex), (v, name)
                checked += 1
        assert checked == 8 + 3 + 8 + 1 + 6  # dense layer 1's attention + MLP, MoE layer 50's attention, router, experts, shared


def test_weight_bytes_by_hand():
    b = twin.weight_bytes("experts-fp4")
    h, inter, e, moe_layers = 6144, 256, 256, 75
    assert b["routed_experts"] == moe_layers * e * 3 * (h * inter // 2 + h * inter // 16 + 8)
    attn = 6144 * 2048 + 6144 * 576 + 2048 * 2048 + 512 * 3584 + 2048 * 6144
    assert b["attention"] == 78 * (attn * 2 + (2048 + 512) * 2)
    assert b["embedding_lm_head"] == 2 * 19360 * 6144 * 2
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    assert 54 * GIB < b["total"] < 57.06 * GIB  # below the field's 57.06 GiB, which adds its MTP layer
    assert twin.weight_bytes("all-fp4")["total"] < b["total"] - 3.5 * GIB


def test_write_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "x").write_text("x")
    with pytest.raises(FileExistsError):
        twin.write(str(tmp_path), "experts-fp4")


def test_cli_prints_bytes_beside_field(tmp_path, capsys):
    assert twin.main(["--out", str(tmp_path / "t"), "--variant", "all-fp4"]) == 0
    out = capsys.readouterr().out
    assert "field: 57.06 GB per GPU" in out and "routed_experts" in out


class _Gate(torch.nn.Module):
    def __init__(self, experts=16, hidden=32):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((experts, hidden), 1e-3))
        self.e_score_correction_bias = torch.nn.Parameter(torch.linspace(-1e-3, 1e-3, experts))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(64, 32)
        self.model.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(3)])
        for i in (1, 2):
            self.model.layers[i].mlp = torch.nn.Module()
            self.model.layers[i].mlp.gate = _Gate()
        self.lm_head = torch.nn.Linear(32, 64, bias=False)
        self.logits_processor = torch.nn.Identity()


def test_spread_zeroes_bias_and_draws_distinct_seeded_gates():
    a, b = _Toy(), _Toy()
    done = twin_router.spread(a)
    twin_router.spread(b)
    assert done["gates"] == 2 and "lm_head" in done and "model.embed_tokens" in done
    g1, g2 = a.model.layers[1].mlp.gate, a.model.layers[2].mlp.gate
    assert torch.count_nonzero(g1.e_score_correction_bias) == 0
    assert not torch.equal(g1.weight, g2.weight)  # one router per layer, unlike the dummy loader's
    assert torch.equal(g1.weight, b.model.layers[1].mlp.gate.weight)  # seeded
    assert a.model.embed_tokens.weight.std() > 0.5


def test_histogram_and_nonfinite_probes(tmp_path, monkeypatch):
    toy = _Toy()
    probe = tmp_path / "probe.json"
    monkeypatch.setenv(twin_router.PROBE_ENV, str(probe))
    monkeypatch.setenv(twin_router.HIST_BS_ENV, "64")
    twin_router._STATE.clear()
    twin_router.after_dummy_load(toy, top_k=2)
    gate = toy.model.layers[1].mlp.gate
    x = torch.randn(64, 32)
    gate(x)
    gate(torch.randn(5, 32))  # not the histogram batch size: not counted
    toy.logits_processor(types.SimpleNamespace(next_token_logits=torch.ones(4, 8)))
    doc = twin_router.dump()
    h = doc["histogram"]["1"]
    assert h["picks"] == 64 * 2 and h["tokens"] == 64 and doc["nonfinite_logits"] is False
    toy.logits_processor(types.SimpleNamespace(next_token_logits=torch.tensor([1.0, float("nan")])))
    assert twin_router.dump()["nonfinite_logits"] is True and json.loads(probe.read_text())["logit_steps"] == 2


def test_spread_summary_flags_a_collapsed_router():
    collapsed = [1024] * 8 + [0] * 248
    s = twin_router.summarize(collapsed, 8, 1024)
    assert s["experts_hit"] == 8 and not twin_router.spread_ok(s)
    even = [32] * 256
    assert twin_router.spread_ok(twin_router.summarize(even, 8, 1024))


def test_install_wraps_upstream_dummy_loader(monkeypatch):
    from sglang.srt.model_loader import loader

    monkeypatch.setattr(loader.DummyModelLoader, "load_model", loader.DummyModelLoader.load_model)
    twin_router.install()
    assert getattr(loader.DummyModelLoader.load_model, "_twin_router", False)


def test_prefill_groups_keep_whole_requests_in_order_under_the_limit():
    assert twin_router.prefill_groups([256] * 5, 512) == [[0, 1], [2, 3], [4]]
    assert twin_router.prefill_groups([100, 9000, 100, 100], 8192) == [[0], [1], [2, 3]]
    assert twin_router.prefill_groups([4096] * 2, 8192) == [[0, 1]]


def test_chunk_prefill_merges_groups_into_one_batch(monkeypatch):
    monkeypatch.setenv(twin_router.PREFILL_ENV, "512")
    calls = []

    class Batch:
        def __init__(self, rids):
            self.rids = list(rids)

        def merge_batch(self, other):
            self.rids += other.rids

    def extend(reqs, model_runner):
        calls.append([r.rid for r in reqs])
        n = len(reqs)
        return torch.arange(n) + 10 * len(calls), torch.zeros(n, 3), Batch(r.rid for r in reqs)

    mod = types.SimpleNamespace(extend=extend)
    twin_router.chunk_prefill(mod)
    twin_router.chunk_prefill(mod)  # idempotent: one wrapper
    reqs = [types.SimpleNamespace(rid=i, origin_input_ids=[0] * 256) for i in range(5)]
    ids, logits, batch = mod.extend(reqs, None)
    assert calls == [[0, 1], [2, 3], [4]]
    assert batch.rids == [0, 1, 2, 3, 4] and ids.tolist() == [10, 11, 20, 21, 30] and logits.shape == (5, 3)
    calls.clear()
    mod.extend(reqs[:2], None)
    assert calls == [[0, 1]]  # one group: upstream's extend as is


def test_prelude_chunks_prefill_before_one_batch_runs():
    pre = twin_router.ONE_BATCH_PRELUDE
    assert pre.index("chunk_prefill(one_batch)") < pre.index("cli_main()")
