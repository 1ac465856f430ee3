"""`python -m sglang.sm120 plan`: upstream alone and the fork side by side for a card, on CPU.

Golden structure, not typed numbers where upstream decides: every size in the plan is checked
against upstream's own resolution of the same command line (plan.resolve), run here too.
"""
import contextlib
import io
import json
import gzip
from pathlib import Path

import pytest

from sglang.sm120.plan import cards, cli, graph_memory, models
from sglang.sm120.plan.resolve import captured_decode_sizes, resolve, upstream_argv

REPO = Path(__file__).resolve().parents[3]
COLUMN_KEYS = {
    "decode_backend", "full_graph_ceiling", "ceiling_rule", "decode_full_sizes", "decode_layerwise_sizes",
    "largest_decode_batch", "prefill_backend", "prefill_buckets", "prefill_request_slots", "attention",
    "fp4_gemm_backend", "moe_runner_backend", "chunked_prefill_size", "max_running_requests",
    "mem_fraction_static", "graph_memory_gb_estimate", "fallbacks", "eager_moe", "decode_attention_layerwise",
}


def _plan(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(list(argv))
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def qwen_tp8():
    flags = ["--tp-size", "8", "--enable-piecewise-cuda-graph", "--max-running-requests", "2048"]
    rc, out = _plan("--model-path", "qwen3-30b-a3b", "--gpu", "rtx-pro-6000", "--json", *flags)
    assert rc == 0, out
    return json.loads(out), flags


def test_the_plan_is_upstreams_resolution_side_by_side(qwen_tp8, tmp_path):
    plan, flags = qwen_tp8
    assert set(plan["upstream"]) == set(plan["fork"]) == COLUMN_KEYS
    assert plan["card"]["key"] == "rtx-pro-6000" and plan["upstream_alone_leaves_out"] == ["--enable-piecewise-cuda-graph"]
    folder = models.write_config(models.KNOWN["qwen3-30b-a3b"](), str(tmp_path))
    card = cards.card("rtx-pro-6000")
    upstream = resolve(folder, card, upstream_argv(flags)[0])
    ours = resolve(folder, card, flags)
    up, fork = plan["upstream"], plan["fork"]
    assert up["decode_backend"] == "full" and up["decode_full_sizes"] == captured_decode_sizes(upstream)
    assert up["full_graph_ceiling"] == max(captured_decode_sizes(upstream))
    assert fork["decode_backend"] == "layerwise"
    assert fork["full_graph_ceiling"] == ours.decode["layerwise_full_max_bs"] == up["full_graph_ceiling"]
    assert fork["decode_full_sizes"] + fork["decode_layerwise_sizes"] == list(ours.decode["bs"])
    assert fork["prefill_buckets"] == list(ours.prefill["bs"]) and fork["prefill_backend"] == "layerwise"
    assert up["prefill_buckets"] == list(upstream.prefill["bs"])
    assert "card and flags" in fork["ceiling_rule"] and "TP 8" in up["ceiling_rule"]
    for col in (up, fork):
        assert all(v > 0 for v in col["graph_memory_gb_estimate"].values())
    assert plan["graph_memory_model"]["label"] == "estimate"


def test_it_warns_when_the_largest_captured_batch_is_below_max_running_requests(qwen_tp8):
    plan, _ = qwen_tp8
    assert plan["fork"]["largest_decode_batch"] < 2048
    assert any(w.startswith("fork: the largest captured decode batch") for w in plan["warnings"])
    assert any(w.startswith("upstream: the largest captured decode batch") for w in plan["warnings"])


def test_the_seed_launch_line_plans_for_glm5_on_8_rtx_pro_6000():
    rc, out = _plan("--model-path", "glm-5", "--gpu", "rtx-pro-6000", "--tp-size", "8", "--quantization",
                    "modelopt_fp4", "--enable-piecewise-cuda-graph", "--piecewise-cuda-graph-compiler", "eager",
                    "--max-running-requests", "1024")
    assert rc == 0, out
    for text in ("upstream alone", "sglang-sm120", "full-graph ceiling", "ESTIMATE", "FP4 GEMM backend",
                 "ceiling rule (fork)", "MLA attention (prefill)"):
        assert text in out, text
    assert "sm120 (fork kernels" in out  # SM120 card, --fp4-gemm-backend auto
    assert "sm120 (fork kernel, once it loads" in out  # SM120 card, ModelOpt NVFP4, --moe-runner-backend auto


@pytest.mark.parametrize("gpu,flags,fork_sm120", [
    ("rtx-pro-6000", ["--quantization", "modelopt_fp4"], True),   # auto on SM120
    ("h200", ["--quantization", "modelopt_fp4"], False),          # auto on SM90: upstream's choice
    ("h200", ["--quantization", "modelopt_fp4", "--moe-runner-backend", "sm120"], True),
    ("rtx-pro-6000", [], False),                                  # bf16 experts: no NVFP4 MoE layer
])
def test_the_moe_backend_column_says_where_the_fork_takes_its_kernel(gpu, flags, fork_sm120):
    """The fork's `auto` picks sm120 for ModelOpt NVFP4 only on an SM120 card, and only once the
    library loads there: resolving on this CPU cannot see that, so the plan says it; upstream
    alone never shows sm120 (the value is the fork's and is left out of its command line)."""
    rc, out = _plan("--model-path", "glm-5", "--gpu", gpu, "--tp-size", "8", "--json", *flags)
    assert rc == 0, out
    plan = json.loads(out)
    fork, up = plan["fork"]["moe_runner_backend"], plan["upstream"]["moe_runner_backend"]
    assert fork.startswith("sm120 (fork kernel") == fork_sm120, fork
    assert "sm120" not in str(up)
    if not fork_sm120:
        assert fork == up  # the fork resolves as upstream does
    assert ("--moe-runner-backend sm120" in plan["upstream_alone_leaves_out"]) == ("sm120" in flags)


def test_upstream_alone_takes_the_same_line_less_the_forks_flags():
    from sglang.sm120.server_flags import restored_legacy_flags

    argv = ["--tp-size", "8", "--enable-piecewise-cuda-graph", "--cuda-graph-backend-decode", "layerwise",
            "--fp4-gemm-backend=sm120", "--cuda-graph-config",
            '{"decode": {"backend": "layerwise", "layerwise_full_max_bs": 64, "max_bs": 512}}',
            "--piecewise-cuda-graph-compiler", "eager"]
    kept, dropped = upstream_argv(argv)
    assert kept[:2] == ["--tp-size", "8"] and json.loads(kept[kept.index("--cuda-graph-config") + 1]) == {
        "decode": {"max_bs": 512}}
    assert "--enable-piecewise-cuda-graph" in dropped and "--fp4-gemm-backend=sm120" in dropped
    # the compiler flag is upstream's own on 0.5.16, restored by the fork where the base dropped it
    assert ("--piecewise-cuda-graph-compiler eager" in dropped) == ("--piecewise-cuda-graph-compiler" in
                                                                     restored_legacy_flags())


def test_a_name_that_is_neither_a_folder_nor_a_built_in_model_is_refused():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, _ = _plan("--model-path", "no-such-model", "--gpu", "h200")
    assert rc == 2 and "built-in models" in err.getvalue()


def test_faking_a_card_leaves_upstream_as_it_was():
    from sglang.srt.utils import common

    before = {k: v for k, v in vars(common).items() if callable(v)}
    with cards.faked_card(cards.card("rtx-5090")):
        assert common.get_device_memory_capacity() == cards.card("rtx-5090").memory_mib
        assert common.is_sm120_supported()
        import sglang.srt.arg_groups.argparse_actions  # noqa: F401  (an import inside the block)
    assert {k: v for k, v in vars(common).items() if callable(v)} == before


def test_the_graph_memory_fit_is_what_its_runs_give(tmp_path):
    data = graph_memory.load()
    assert data["label"] == "estimate"
    refit = graph_memory.fit(data["runs"], data["model"])
    assert {(p, k, c): v for p, ks in data["coefficients"].items() for k, cs in ks.items() for c, v in cs.items()} \
        == pytest.approx({(p, k, c): v for p, ks in refit.items() for k, cs in ks.items() for c, v in cs.items()})
    results = REPO / "benchmarks" / "results"
    runner = sorted({r["source"].split(":")[0] for r in data["runs"]} - {"plan-check.json"})
    # the runner benchmark's runs are read from its result of record, in the tree
    assert graph_memory.runs_from_results([results / n for n in runner]) \
        == [r for r in data["runs"] if not r["source"].startswith("plan-check.json:")]
    # plan-check's runs: the result of record holds each server's measured memory and its sizes'
    # counts and ends (the full size lists came from plan-<model>.json beside it on the GPU host)
    check = {row["model"]: row for row in json.loads((results / "plan-check.json").read_text())["models"]}
    from_check = [r for r in data["runs"] if r["source"].startswith("plan-check.json:")]
    assert from_check, "the fit has no plan-check run (the tiny models' memory)"
    for r in from_check:
        row = check[r["source"].split(":")[1]]
        assert r["model"] == row["model_dims"]
        assert r["measured_gb"] == next(m["measured_gb"] for m in row["verdict"]["graph_memory"]
                                        if m["phase"] == r["phase"])
        told = {c["what"].split(" (")[0]: c["server"] for c in row["verdict"]["sizes"]}
        if r["phase"] == "decode":
            full, lw = r["sizes"].get("full", []), r["sizes"].get("layerwise", [])
            assert told["decode full graphs"] == [max(full), len(full)]
            assert told["decode layerwise sizes"] == [lw[0], lw[-1], len(lw)]
        else:
            (buckets,) = r["sizes"].values()
            assert told["prefill buckets"][:3] == [len(buckets), buckets[0], buckets[-1]]
    # the acceptance bound of plan-check (25%) holds on every run the fit has seen
    assert max(abs(e["error"]) for e in graph_memory.errors(data)) < 0.25


def test_a_plan_check_run_enters_the_fit_scaled_by_its_model(tmp_path):
    """Models' plan-check runs whose graph memory follows the estimate's form exactly, each with
    its own layers and width: the refit recovers the coefficients, and the estimate then gives
    each run's measured memory."""
    ref = {"num_hidden_layers": 48, "hidden_size": 2048}
    coef = {"full": (0.004, 0.002, 0.0005), "layerwise": (0.03, 0.0001, 0.0004)}
    models = {"small": ({"num_hidden_layers": 4, "hidden_size": 256}, [1, 2, 4, 8], [16, 32]),
              "big": ({"num_hidden_layers": 48, "hidden_size": 2048}, list(range(8, 257, 8)), [288, 320, 1024]),
              "mid": ({"num_hidden_layers": 24, "hidden_size": 1024}, [1, 8, 64, 128], [512, 1024, 2048]),
              "wide": ({"num_hidden_layers": 3, "hidden_size": 6144}, [1, 2, 4, 8, 12, 16], [24, 48, 96]),
              "deep": ({"num_hidden_layers": 78, "hidden_size": 512}, [1, 2], [4, 8, 16, 32, 64, 128, 256]),
              "glm5": ({"num_hidden_layers": 78, "hidden_size": 6144}, [1, 2, 4, 8, 512], [640, 768]),
              "tiny": ({"num_hidden_layers": 3, "hidden_size": 256}, list(range(1, 40)), [64]),
              "no-dims": (None, [1], [2])}  # a run from before model dims were recorded: left out
    rows = []
    for name, (dims, full, layerwise) in models.items():
        scale = dims["num_hidden_layers"] * dims["hidden_size"] / (48 * 2048) if dims else 1
        gb = sum(a * len(ss) + b * max(ss) + c * scale * max(ss)
                 for (a, b, c), ss in ((coef["full"], full), (coef["layerwise"], layerwise)))
        (tmp_path / f"plan-{name}.json").write_text(json.dumps({"fork": {
            "decode_full_sizes": full, "decode_layerwise_sizes": layerwise,
            "prefill_backend": "layerwise", "prefill_buckets": [8, 4096]}}))
        rows.append({"model": name, **({"model_dims": dims} if dims else {}),
                     "verdict": {"sizes": [{"ok": True}], "graph_memory": [{"phase": "decode", "measured_gb": gb}]}})
    (tmp_path / "plan-check.json").write_text(json.dumps({"benchmark": "plan-check", "models": rows}))
    runs = graph_memory.runs_from_plan_check(str(tmp_path / "plan-check.json"))
    assert [r["source"].split(":")[1] for r in runs] == ["small", "big", "mid", "wide", "deep", "glm5", "tiny"]
    fitted = graph_memory.fit(runs, ref)["decode"]
    for k in ("full", "layerwise"):
        assert [fitted[k][c] for c in "abc"] == pytest.approx(coef[k], rel=1e-6)
    data = {"model": ref, "coefficients": {"decode": fitted, "prefill": {}}, "runs": runs}
    assert max(abs(e["error"]) for e in graph_memory.errors(data)) < 1e-6


def test_compare_reads_the_servers_plan_line_and_graph_memory():
    """Against the H200 demo server's log (tiny qwen3_moe NVFP4, base 0.5.16): the log's own
    numbers come back; a plan whose sizes differ is refused."""
    from sglang.sm120.plan import compare

    log = gzip.decompress((REPO / "benchmarks/results/logs/demo.log.gz").read_bytes()).decode(errors="replace")
    seen = compare.logged(log)
    assert seen["decode"] == {"full_max": 256, "full_count": 36, "layerwise": [288, 1024, 16]}
    assert seen["prefill"] == {"count": 19, "range": [8, 8192], "slots": 64}
    assert set(seen["memory_gb"]) == {"decode", "prefill"}
    from sglang.sm120.runner.sizes import plan_decode, plan_prefill

    dec, pre = plan_decode(ceiling=256, every_size=False), plan_prefill(max_tokens=8192, req_slots=64)
    fork = {"decode_full_sizes": dec.full_sizes, "decode_layerwise_sizes": dec.layerwise_sizes,
            "prefill_backend": "layerwise", "prefill_buckets": list(pre.buckets), "prefill_request_slots": 64,
            "graph_memory_gb_estimate": {p: seen["memory_gb"][p] for p in ("decode", "prefill")}}
    assert compare.compare({"fork": fork}, log)["ok"]
    fork["decode_layerwise_sizes"] = fork["decode_layerwise_sizes"][:-1]
    assert not compare.compare({"fork": fork}, log)["ok"]


def test_the_plan_names_what_runs_the_moe_between_layerwise_segments(qwen_tp8, monkeypatch):
    """bf16 experts: the lean step on the base it is ported to, upstream's path elsewhere (said);
    sm120 experts: the kernel call on both bases; upstream alone has no segments."""
    from sglang.sm120 import upstream_api
    from sglang.sm120.runner import lean_moe

    plan, _ = qwen_tp8
    base = upstream_api.installed_base()
    assert plan["upstream"]["eager_moe"] == "-"
    if base in lean_moe.LEAN_STEP_BASES:
        assert plan["fork"]["eager_moe"] == "lean step: upstream's Triton launches (bf16 experts)"
    else:
        assert plan["fork"]["eager_moe"] == f"upstream's MoE path (the lean step is not ported to {base})"
    col = dict(plan["fork"], moe_runner_backend="sm120 (fork kernel, ...)")
    assert cli._eager_moe(col, base) == "lean step: the sm120 kernel call"
    assert cli._eager_moe(dict(col, moe_runner_backend="flashinfer_cutlass"), base) == \
        "upstream's MoE path (flashinfer_cutlass)"
    assert cli._eager_moe(dict(col, decode_layerwise_sizes=[]), base) == "-"
    monkeypatch.setenv("SGLANG_SM120_LEAN_MOE", "0")
    assert cli._eager_moe(col, base) == "upstream's MoE path (SGLANG_SM120_LEAN_MOE=0)"


@pytest.mark.parametrize("gpu, moe, eager", [
    ("rtx-pro-6000", "sm120 (fork kernel, once it loads and passes its self-check on the GPU)",
     "lean step: the sm120 kernel call"),
    ("h200", "auto", "upstream's MoE path (modelopt_fp4 experts; the lean step takes bf16/fp16 ones)")])
def test_a_checkpoints_own_quantization_reaches_the_plan(tmp_path, gpu, moe, eager):
    """A ModelOpt NVFP4 checkpoint (hf_quant_config.json) served without --quantization: server
    args leave it None until the model loads, the plan reads it as upstream's ModelConfig does."""
    from sglang.sm120.tiny import twin

    twin.write(str(tmp_path / "m"), "experts-fp4")
    rc, out = _plan("--model-path", str(tmp_path / "m"), "--gpu", gpu, "--json", "--load-format", "dummy",
                    "--cuda-graph-backend-decode", "layerwise", "--cuda-graph-max-bs-decode", "1024")
    assert rc == 0, out
    fork = json.loads(out)["fork"]
    assert (fork["moe_runner_backend"], fork["eager_moe"]) == (moe, eager)


def test_the_plan_names_what_runs_decode_attention_at_layerwise_sizes(qwen_tp8, monkeypatch):
    """An eager step on the real batch for MHA models on FlashInfer / FA3 (the server's default);
    captured with the padded plan for MLA, other backends, or when asked; upstream has no
    layerwise sizes."""
    plan, _ = qwen_tp8
    assert plan["upstream"]["decode_attention_layerwise"] == "-"
    backend = plan["fork"]["attention"]["decode_attention_backend"] or plan["fork"]["attention"]["attention_backend"]
    want = "eager step, real batch's plan" if backend in ("flashinfer", "fa3", "fa4") else f"captured, padded plan ({backend})"
    assert plan["fork"]["decode_attention_layerwise"] == want
    col = dict(plan["fork"], attention={"attention_backend": "flashinfer", "decode_attention_backend": None})
    assert cli._eager_attention(col, {}) == "eager step, real batch's plan"
    assert cli._eager_attention(col, {"kv_lora_rank": 512}) == "captured, padded plan (MLA)"
    assert cli._eager_attention(dict(col, attention={"attention_backend": "triton"}), {}) == \
        "captured, padded plan (triton)"
    assert cli._eager_attention(dict(col, decode_layerwise_sizes=[]), {}) == "-"
    monkeypatch.setenv("SGLANG_SM120_LAYERWISE_DECODE_ATTENTION", "captured")
    assert cli._eager_attention(col, {}) == \
        "captured, padded plan (SGLANG_SM120_LAYERWISE_DECODE_ATTENTION=captured)"
