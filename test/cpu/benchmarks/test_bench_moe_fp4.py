"""bench_moe_fp4 without a GPU: its case list and --plan, the per-row ratios and bandwidths, the
targets per shape set (results-file schema) and the report; the shared MoE timing helpers'
CPU-side arithmetic (ops per chain, EP id mapping, distinct experts)."""
import json

import pytest
import repo_scripts
import torch

NAMES = ["glm5-tp8", "glm5-ep8", "qwen3-30b"]


@pytest.fixture(scope="module")
def bench():
    return repo_scripts.load("benchmarks/bench_moe_fp4.py")


def test_cases_cover_every_shape_set_and_size(bench):
    c = bench.cases()
    assert [x["shape"] for x in c[:: len(bench.TOKENS)]] == NAMES
    assert [x["tokens"] for x in c[: len(bench.TOKENS)]] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    by = {x["shape"]: x for x in c}
    # the shapes: GLM-5 TP-8 rank gate_up 512 x 6144, down 6144 x 256; EP-8 32 of 256 experts,
    # gate_up 4096 x 6144, down 6144 x 2048; Qwen3-30B-A3B 128 experts, hidden 2048, intermediate 768
    assert (by["glm5-tp8"]["experts"], by["glm5-tp8"]["gate_up"], by["glm5-tp8"]["down"]) == (256, [512, 6144], [6144, 256])
    assert (by["glm5-ep8"]["experts"], by["glm5-ep8"]["global_experts"], by["glm5-ep8"]["gate_up"],
            by["glm5-ep8"]["down"]) == (32, 256, [4096, 6144], [6144, 2048])
    assert (by["qwen3-30b"]["experts"], by["qwen3-30b"]["gate_up"]) == (128, [1536, 2048])
    assert all(x["topk"] == 8 for x in c)


def test_plan_prints_the_cases_without_a_gpu(bench, capsys):
    assert bench.main(["--plan", "--shapes", "glm5-ep8,qwen3-30b", "--tokens", "1,256"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["shape"], x["tokens"]) for x in lines] == [("glm5-ep8", 1), ("glm5-ep8", 256), ("qwen3-30b", 1),
                                                          ("qwen3-30b", 256)]
    with pytest.raises(SystemExit) as e:
        bench.main(["--plan", "--shapes", "llama"])
    assert e.value.code == 2 and "unknown MoE shape set 'llama'" in capsys.readouterr().err


def test_k_warps_sweep_option(bench, capsys):
    assert bench.parse_k_warps("8/1, 4/1,1/8") == ((8, 1), (4, 1), (1, 8)) and bench.parse_k_warps("") == ()
    assert bench.sweep_key(4, 1) == "sm120_kw4_1"
    for bad, why in (("3/1", "1, 2, 4 or 8"), ("4", "GATE_UP/DOWN"), ("a/b", "GATE_UP/DOWN")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--plan", "--k-warps", bad])
        assert e.value.code == 2 and why in capsys.readouterr().err


def _row(bench, shape, tokens, ours, marlin, bf16=None, copy_bw=4e12):
    r = {"shape": shape, "tokens": tokens, "ours_us": ours, "marlin_us": marlin, "bf16_us": bf16,
         "experts_hit_mean": 8.0, "weight_bytes": 8 * 2_654_208, "bf16_weight_bytes": 8 * 9_437_184}
    bench.set_ratios(r, copy_bw)
    return r


def test_ratios_and_bandwidth_on_the_bytes_read(bench):
    r = _row(bench, "qwen3-30b", 1, ours=10.0, marlin=15.0, bf16=40.0)
    assert r["speedup_vs_marlin"] == 1.5 and r["speedup_vs_bf16"] == 4.0
    assert r["ours_gbps"] == round(8 * 2_654_208 / 10e-6 / 1e9, 1)
    assert r["ours_bw_pct"] == round(100 * 8 * 2_654_208 / 10e-6 / 4e12, 1)
    assert r["bf16_bw_pct"] == round(100 * 8 * 9_437_184 / 40e-6 / 4e12, 1)
    r = _row(bench, "qwen3-30b", 1, ours=10.0, marlin=None)
    assert r["speedup_vs_marlin"] is None and r["marlin_gbps"] is None


def test_targets_per_shape_set(bench):
    rows = [_row(bench, "glm5-tp8", t, 10.0, 15.0, 30.0) for t in bench.TOKENS]  # 1.5x everywhere: met
    # 1.4x up to 256 (geomean met), 0.9x at 512: the minimum is not
    rows += [_row(bench, "glm5-ep8", t, 10.0, 9.0 if t == 512 else 14.0) for t in bench.TOKENS]
    rows += [_row(bench, "qwen3-30b", t, 10.0, None) for t in bench.TOKENS]  # no Marlin
    targets, summary = bench.summarize(rows, NAMES, {"qwen3-30b": "ImportError: no sgl_kernel"})
    assert all(set(t) >= {"value", "target", "met"} for t in targets.values())
    assert targets["speedup_vs_marlin_geomean_1_256_glm5-tp8"] == {
        "value": 1.5, "target": ">= 1.3 (geomean, tokens 1-256)", "met": True}
    assert targets["speedup_vs_marlin_min_glm5-tp8"]["met"]
    assert targets["speedup_vs_marlin_geomean_1_256_glm5-ep8"]["met"]
    low = targets["speedup_vs_marlin_min_glm5-ep8"]
    assert (low["value"], low["met"], low["at_tokens"]) == (0.9, False, 512)
    for k in ("speedup_vs_marlin_geomean_1_256_qwen3-30b", "speedup_vs_marlin_min_qwen3-30b"):
        assert targets[k]["value"] is None and not targets[k]["met"] and "no sgl_kernel" in targets[k]["missing"]
    assert summary["glm5-tp8"]["speedup_vs_bf16_geomean_1_256"] == 3.0
    # Marlin missing at one size: the shape set's targets are not judged on the rest
    part = [_row(bench, "glm5-tp8", t, 10.0, None if t == 64 else 15.0) for t in bench.TOKENS]
    t2, _ = bench.summarize(part, ["glm5-tp8"])
    assert not t2["speedup_vs_marlin_min_glm5-tp8"]["met"] and "every size" in t2["speedup_vs_marlin_min_glm5-tp8"]["missing"]


def test_report(bench, tmp_path):
    rows = [_row(bench, "glm5-tp8", t, 10.0, 15.0, 30.0) for t in (1, 256)]
    targets, summary = bench.summarize(rows, ["glm5-tp8"])
    meta = {"device": "NVIDIA H200", "date": "2026-12-05", "commit": "abc", "torch": "2.11", "copy_bw_tbps": 4.0,
            "launch_floor_us": 2.0, "marlin": "upstream", "bf16": "triton"}
    bench.write_md(tmp_path / "r.md", meta, rows, targets, summary)
    md = (tmp_path / "r.md").read_text()
    assert "| speedup_vs_marlin_geomean_1_256_glm5-tp8 | 1.5 |" in md and "| glm5-tp8 | 256 | 8.0 | 10.00 |" in md


def test_moe_timing_helpers():
    from sglang.sm120.check import moe_timing as MT
    from sglang.sm120.model_shapes import moe_shape

    ep, tp = moe_shape("glm5-ep8"), moe_shape("glm5-tp8")
    assert MT.expert_map(tp, "cpu") is None
    m = MT.expert_map(ep, "cpu")
    assert m.shape == (256,) and m[:32].tolist() == list(range(32)) and bool((m[32:] == -1).all())
    (ids, w), = MT.routings(ep, 64, 1, "cpu")
    assert ids.dtype == torch.int32 and bool(((ids >= -1) & (ids < 32)).all()) and bool((ids == -1).any())
    assert w.dtype == torch.float32 and tuple(w.shape) == (64, 8)
    assert MT.distinct_local(torch.tensor([[-1, 3, 3], [31, 32, 5]]), 32) == 3
    # one token on the EP rank hits ~1 expert: enough ops that the chain reads > 2.5x L2; a large
    # call reads every expert: the minimum of 2
    l2 = 60 << 20
    n = MT.ops_needed(ep, 1, 21_233_664, l2)
    assert n * 1.0 * 21_233_664 > 2.5 * l2 and n <= MT.MAX_OPS
    assert MT.ops_needed(tp, 1024, 2_654_208, l2) == 2
    assert MT.ops_needed(tp, 1, 1, l2) == MT.MAX_OPS
    routes = [(ids, w)]
    assert MT.marlin_weights(routes, ep)[0][1].sub(w * 2.5).abs().max() == 0
    assert MT.marlin_weights(routes, moe_shape("qwen3-30b"))[0][1] is w
    ws2 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    t = MT.shared_gate_up_scale({"w13_weight_scale_2": ws2})
    assert t["w13_weight_scale_2"].tolist() == [[1.0, 1.0], [3.0, 3.0]] and ws2[0, 1] == 2.0


def test_marlin_layer_carries_what_upstreams_prepare_reads_and_the_call_what_its_runner_reads():
    """marlin_moe_op with upstream's real classes but a recording prepare and runner (the real ones
    launch CUDA kernels): every `layer.X` upstream's prepare_moe_nvfp4_layer_for_marlin reads is
    set, w13's global scale is the gate's, and EP passes the expert map and global expert count."""
    import inspect
    import re

    from sglang.sm120.check import moe_timing as MT
    from sglang.sm120.kernels import moe
    from sglang.sm120.model_shapes import MoeShape

    real = MT.load_marlin_moe()
    reads = set(re.findall(r"layer\.(\w+)", inspect.getsource(real.prepare)))
    written = set(re.findall(r"layer\.(\w+)\s*=", inspect.getsource(real.prepare)))
    seen = {}

    def prepare(layer):
        seen["missing"] = sorted(a for a in reads - written if not hasattr(layer, a))
        seen["ws2"] = layer.w13_weight_scale_2.detach().clone()

    def run(dispatch, info, config):
        seen.update(info=info, config=config, topk=dispatch.topk_output)
        return type("Combine", (), {"hidden_states": dispatch.hidden_states})()

    api = type(real)(**{**vars(real), "prepare": prepare, "run": run})
    shape = MoeShape("tiny-ep", experts=4, hidden=64, inter=32, global_experts=16, routed_scaling=2.5)
    tensors = moe.synthetic_experts(4, 64, 32, "cpu", seed=0)
    op = MT.marlin_moe_op(api, tensors, shape, "cpu")
    assert seen["missing"] == [], f"upstream's prepare reads layer attributes marlin_moe_op does not set: {seen['missing']}"
    assert torch.equal(seen["ws2"], tensors["w13_weight_scale_2"][:, 0])
    (ids, w), = MT.routings(shape, 5, 1, "cpu")
    x = torch.zeros(5, 64, dtype=torch.bfloat16)
    op(x, ids, w)
    assert seen["info"].global_num_experts == 16 and seen["info"].expert_map[:4].tolist() == [0, 1, 2, 3]
    assert seen["config"].routed_scaling_factor is None and seen["topk"].topk_ids is ids
    assert tuple(seen["topk"].router_logits.shape) == (5, 16)


def test_flat_row_from_a_timed_cell(bench):
    from sglang.sm120.model_shapes import moe_shape

    cell = {"shape": "qwen3-30b", "tokens": 4, "ops": 8, "experts_hit_mean": 8.0, "weight_bytes": 8 * 2_654_208,
            "us": {"bf16": 40.0, "bf16_repeat": 41.0, "sm120": 10.0}, "failed": {"marlin": "RuntimeError: boom"}}
    r = bench.flat_row(cell, moe_shape("qwen3-30b"), 4e12, {})
    assert (r["ours_us"], r["bf16_us"], r["bf16_repeat_us"], r["marlin_us"]) == (10.0, 40.0, 41.0, None)
    assert r["marlin_missing"] == "RuntimeError: boom" and "bf16_missing" not in r
    assert r["bf16_weight_bytes"] == 8 * 3 * 2048 * 768 * 2 and r["speedup_vs_bf16"] == 4.0
    r = bench.flat_row({**cell, "us": {"sm120": 10.0}, "failed": {}}, moe_shape("qwen3-30b"), 4e12,
                       {"bf16": "ImportError: triton"})
    assert r["bf16_missing"] == "ImportError: triton" and r["marlin_missing"] == "not available"


def test_kernel_split_reports_an_upstream_backend_that_fails_and_raises_on_ours(bench):
    def boom(*a):
        raise RuntimeError("Global server args is not set yet!")

    x = torch.zeros(2, 8)
    assert bench.kernel_split({"marlin": boom, "bf16": boom}, x, lambda key: [(None, None)]) == {
        "marlin": {"failed": "RuntimeError: Global server args is not set yet!"},
        "bf16": {"failed": "RuntimeError: Global server args is not set yet!"}}
    with pytest.raises(RuntimeError, match="not set yet"):
        bench.kernel_split({"sm120": boom}, x, lambda key: [(None, None)])


def test_upstream_moe_kernels_get_upstreams_default_flags_outside_a_server():
    """Upstream's Triton MoE reads get_server_args() flags, which only a server publishes (the
    first H200 run of bench_moe_fp4 died on it). 0.5.16: publish_kernel_flags publishes a stand-in
    with ServerArgs' defaults and leaves a published one alone; 0.5.23: it says why it cannot, and
    setup leaves every upstream backend out with that reason."""
    from sglang.sm120 import upstream_api as U
    from sglang.sm120.check import moe_timing as MT

    ctx = U.require("runtime_context.get_context")()
    saved = ctx._server_args
    try:
        ctx._server_args = None
        why = MT.publish_kernel_flags()
        if U.installed_base() == "0.5.23":
            assert "0.5.23" in why and ctx._server_args is None
            return
        assert why is None
        args = U.require("runtime_context.get_server_args")()
        defaults = U.require("ServerArgs")
        for f in MT.KERNEL_FLAGS:
            assert getattr(args, f) == getattr(defaults, f) is False
        mine = type("Published", (), {"enable_deterministic_inference": True})()
        ctx._server_args = mine
        assert MT.publish_kernel_flags() is None and U.require("runtime_context.get_server_args")() is mine
    finally:
        ctx._server_args = saved
