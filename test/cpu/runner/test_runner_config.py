"""Flag / config resolution of the layerwise backend.

Two levels: sglang.sm120.runner.config on stand-in objects (fast, no sglang), and the real
upstream ServerArgs with the chosen base's patch series applied (patches/<base>/series), run
in a subprocess over a patched source tree built with forkbuild from the pinned upstream wheel.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import buildenv

from sglang.sm120.runner import config as C

REPO = Path(__file__).resolve().parents[3]


def _phase(backend, **kw):
    base = dict(backend=backend, max_bs=None, bs=None, tc_compiler="eager",
                full_prefill_max_req=None, layerwise_full_max_bs=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _args(decode="layerwise", prefill="layerwise", locked=(), **kw):
    from sglang.sm120.upstream_api import SERVER_ARGS_FIELDS

    # every upstream field the overlay reads (upstream_api), unset unless given below
    sa = SimpleNamespace(**{f: None for f in SERVER_ARGS_FIELDS})
    sa.__dict__.update(
        cuda_graph_config=SimpleNamespace(
            decode=_phase(decode, max_bs=256, bs=list(range(1, 257))),
            prefill=_phase(prefill, max_bs=8192, bs=list(range(4, 8193, 4))),
        ),
        _cuda_graph_config_locked=set(locked),
        device="cuda", chunked_prefill_size=8192, max_running_requests=None,
        cuda_graph_layerwise_every_size=False, cuda_graph_tc_compiler=None,
        # The ServerArgs methods the resolution calls (upstream_api declares them): a plain
        # non-MLA model whose upstream prefill rules find nothing to disable.
        use_mla_backend=lambda: False, get_model_config=lambda: None,
        get_attention_backends=lambda: (None, None),
        _disable_breakable_cudagraph_if_incompatible=lambda: None,
        _disable_tc_piecewise_cudagraph_if_incompatible=lambda: None,
        _disable_full_prefill_cudagraph_if_incompatible=lambda: None,
    )
    for k, v in kw.items():
        setattr(sa, k, v)
    return sa


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv(C.DYNAMO_FREE_ENV, raising=False)
    monkeypatch.delenv(C.FLASHINFER_WORKSPACE_ENV, raising=False)
    C._ENV_BEFORE.clear()


def test_finalize_default_plans_both_phases():
    sa = _args()
    res = C.finalize(sa)
    dec, pre = sa.cuda_graph_config.decode, sa.cuda_graph_config.prefill
    assert dec.layerwise_full_max_bs == 256 and dec.max_bs == 1024 and dec.bs[-1] == 1024
    assert res.decode.full_sizes[-1] == 256 and res.decode.layerwise_sizes[0] == 288
    assert pre.bs[-1] == 8192 and len(pre.bs) < 25 and pre.full_prefill_max_req == 64
    assert os.environ[C.DYNAMO_FREE_ENV] == "1"


def test_finalize_every_size_and_explicit_ceiling():
    sa = _args(cuda_graph_layerwise_every_size=True)
    C.finalize(sa)
    assert sa.cuda_graph_config.decode.layerwise_full_max_bs == 0
    sa = _args(locked={("decode", "layerwise_full_max_bs")})
    sa.cuda_graph_config.decode.layerwise_full_max_bs = 64
    res = C.finalize(sa)
    assert res.decode.full_max_bs == 64 and res.decode.full_sizes[-1] == 64


def test_finalize_operator_max_bs_is_the_top_over_upstreams_default_ceiling():
    # upstream's memory step, asked what it picks when the operator names no decode max batch
    sa = _args(locked={("decode", "max_bs")}, upstream_default_decode_max_bs=lambda: 160)
    sa.cuda_graph_config.decode.max_bs = 512
    res = C.finalize(sa)
    assert res.decode.max_bs == 512 and res.decode.full_max_bs == 160
    assert "160" in res.ceiling_rule and "512" in res.ceiling_rule
    sa = _args(locked={("decode", "max_bs")}, upstream_default_decode_max_bs=lambda: 160)
    sa.cuda_graph_config.decode.max_bs = 64  # below the default: every size a full graph
    res = C.finalize(sa)
    assert res.decode.max_bs == res.decode.full_max_bs == 64


def test_finalize_running_requests_cap_the_top_and_the_ceiling():
    sa = _args(max_running_requests=300)
    res = C.finalize(sa)
    assert res.decode.max_bs == 300 and res.decode.full_max_bs == 256
    sa = _args(max_running_requests=100)
    res = C.finalize(sa)
    assert res.decode.max_bs == res.decode.full_max_bs == 100 and "--max-running-requests" in res.ceiling_rule


def test_finalize_without_upstreams_default_is_an_error_not_a_guess():
    sa = _args(locked={("decode", "max_bs")})
    with pytest.raises(AttributeError, match="upstream_default_decode_max_bs"):
        C.finalize(sa)


def test_finalize_legacy_prefill_tokens_are_the_buckets(caplog):
    sa = _args(locked={("prefill", "bs"), ("prefill", "tc_compiler")}, cuda_graph_tc_compiler="inductor")
    sa.cuda_graph_config.prefill.bs = [4096, 128, 1024]
    with caplog.at_level("WARNING"):
        res = C.finalize(sa)
    assert res.prefill.buckets == (128, 1024, 4096)
    assert "ignored by the layerwise backend" in caplog.text


def test_finalize_falls_back_per_phase_on_unsupported_features(caplog):
    sa = _args(enable_torch_compile=True)
    with caplog.at_level("WARNING"):
        res = C.finalize(sa)
    assert sa.cuda_graph_config.decode.backend == "full"
    assert sa.cuda_graph_config.prefill.backend != "layerwise"
    assert res.decode is None and res.prefill is None
    assert "--enable-torch-compile" in caplog.text
    assert C.DYNAMO_FREE_ENV not in os.environ


def test_a_fallback_prefill_backend_obeys_upstreams_rules_for_it(caplog, monkeypatch):
    # An MLA model falls back from layerwise prefill; upstream disables its default (breakable)
    # prefill graphs for MLA, and skips that rule when the operator named the backend, so the
    # fallback must apply it: the control (upstream alone) runs that prefill eagerly.
    # Upstream's default as on a CUDA host (without a GPU some bases default to 'disabled').
    monkeypatch.setattr(C, "_upstream_default", lambda phase: "breakable" if phase == "prefill" else "full")
    sa = _args(locked={("prefill", "backend")}, use_mla_backend=lambda: True)
    seen = []

    def rule(name):
        def apply():
            seen.append(name)
            sa.cuda_graph_config.prefill.backend = "disabled"
        return apply

    for backend, name in C._UPSTREAM_PREFILL_RULES.items():
        setattr(sa, name, rule(backend))
    with caplog.at_level("WARNING"):
        res = C.finalize(sa)
    assert seen == ["breakable"]
    assert sa.cuda_graph_config.prefill.backend == "disabled"
    assert res.prefill is None and res.fallbacks == {"prefill": ["MLA attention (prefill)"]}
    assert "prefill phase uses 'disabled' instead" in caplog.text
    assert sa.cuda_graph_config.decode.backend == "layerwise"  # decode keeps layerwise


def test_env_switches_follow_the_latest_server_args():
    """The first H200 run: the graphs-disabled reference ran before the layerwise engine, so it
    used torch.compile'd MoE helpers while layerwise used the eager ones, and every later engine
    in the process inherited SGLANG_SM120_DYNAMO_FREE=1. The env must follow each ServerArgs."""
    C.finalize(_args())
    assert os.environ[C.DYNAMO_FREE_ENV] == "1"
    assert C.finalize(_args(decode="disabled", prefill="disabled")) is None
    assert C.DYNAMO_FREE_ENV not in os.environ
    C.finalize(_args())
    assert os.environ[C.DYNAMO_FREE_ENV] == "1"
    C.finalize(_args(enable_torch_compile=True))  # both phases fall back: not layerwise
    assert C.DYNAMO_FREE_ENV not in os.environ


def test_env_switches_keep_the_operators_values(monkeypatch):
    monkeypatch.setenv(C.DYNAMO_FREE_ENV, "1")
    monkeypatch.setenv(C.FLASHINFER_WORKSPACE_ENV, str(64 << 20))
    sa = _args()
    sa.get_attention_backends = lambda: ("flashinfer", "flashinfer")
    sa.use_mla_backend = lambda: False
    sa.get_model_config = lambda: SimpleNamespace(hf_config=SimpleNamespace(
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, hidden_size=4096))
    C.finalize(sa)
    assert int(os.environ[C.FLASHINFER_WORKSPACE_ENV]) > 64 << 20  # grown for bs 1024
    C.finalize(_args(decode="full", prefill="breakable"))
    assert os.environ[C.DYNAMO_FREE_ENV] == "1"
    assert os.environ[C.FLASHINFER_WORKSPACE_ENV] == str(64 << 20)
    C.finalize(sa)
    monkeypatch.setenv(C.FLASHINFER_WORKSPACE_ENV, "123")  # changed by someone else since
    C.finalize(_args(decode="disabled", prefill="disabled"))
    assert os.environ[C.FLASHINFER_WORKSPACE_ENV] == "123"


def test_finalize_ignores_other_backends():
    sa = _args(decode="full", prefill="breakable")
    assert C.finalize(sa) is None
    assert sa.cuda_graph_config.decode.bs == list(range(1, 257))


def test_flashinfer_workspace_formula_explains_the_measured_overflow():
    # Qwen3-30B-A3B, one GPU: 32 q heads, 4 kv heads, head_dim 128, decode bs 1024. Upstream's
    # FlashInfer workspace at that size fails with "Buffer overflow ... batch_prefill_tmp_s ... only
    # 262144 bytes available" in 384 MiB.
    heads, tiles, cta, hd = 32, (1024 * 8 // 16) + 1024 - 1, 16, 128
    tmp_v = heads * tiles * cta * hd * 4
    assert C.FLASHINFER_DEFAULT_WORKSPACE - tmp_v == 262144
    need = C.flashinfer_decode_workspace_bytes(1024, 32, 4, 128)
    assert need >= 1.25 * (tmp_v + heads * tiles * cta * 4) and need % (64 << 20) == 0
    assert C.flashinfer_decode_workspace_bytes(256, 32, 4, 128) < C.FLASHINFER_DEFAULT_WORKSPACE


def _enable(ns):  # what --enable-piecewise-cuda-graph's action does (sglang.sm120.server_flags)
    C.select_layerwise_for_unset_phases(ns)


def _disable_prefill(ns):  # upstream's --disable-piecewise-cuda-graph
    ns.cuda_graph_backend_prefill = "disabled"


def _decode_full(ns):  # --cuda-graph-backend-decode full
    ns.cuda_graph_backend_decode = "full"


@pytest.mark.parametrize(
    "others, want",
    [
        ([], ("layerwise", "layerwise")),
        ([_disable_prefill], ("layerwise", "disabled")),
        ([_decode_full], ("full", "layerwise")),
    ],
)
def test_enable_piecewise_selects_unset_phases_in_any_order(others, want):
    for actions in ([_enable] + others, others + [_enable]):
        ns = argparse.Namespace(cuda_graph_backend_decode=None, cuda_graph_backend_prefill=None)
        for act in actions:
            act(ns)
        assert (ns.cuda_graph_backend_decode, ns.cuda_graph_backend_prefill) == want


# ------------------------------------------------------------------------------------------------
# real ServerArgs with the series applied
# ------------------------------------------------------------------------------------------------
_SCENARIOS = textwrap.dedent(
    r'''
    import contextlib, io, json, logging, os, sys
    records = []
    class H(logging.Handler):
        def emit(self, r):
            records.append(r.getMessage())
    import argparse
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = {o for a in parser._actions for o in a.option_strings}
    # on the overlay's logger: sglang re-configures the root logger while resolving args
    logging.getLogger("sglang.sm120").addHandler(H())
    logging.getLogger("sglang.sm120").setLevel(logging.INFO)
    model, mla_model = sys.argv[1], sys.argv[2]
    base = ["--model-path", model, "--device", "cuda", "--skip-tokenizer-init",
            "--attention-backend", "flashinfer", "--load-format", "dummy"]
    scenarios = {
        "both": ["--cuda-graph-backend-decode", "layerwise", "--cuda-graph-backend-prefill", "layerwise"],
        "every": ["--cuda-graph-backend-decode", "layerwise", "--cuda-graph-layerwise-every-size"],
        "json": ["--cuda-graph-config", '{"decode":{"backend":"layerwise","layerwise_full_max_bs":64}}'],
        "legacy": ["--cuda-graph-backend-prefill", "layerwise", "--piecewise-cuda-graph-tokens", "128", "1024", "4096",
                   "--piecewise-cuda-graph-compiler", "inductor"],
        "maxtok": ["--cuda-graph-backend-prefill", "layerwise", "--piecewise-cuda-graph-max-tokens", "2048"],
        "disable": ["--cuda-graph-backend-decode", "layerwise", "--disable-piecewise-cuda-graph"],
        "compile": ["--cuda-graph-backend-decode", "layerwise", "--enable-torch-compile"],
        "alias": ["--enable-piecewise-cuda-graph"],
        "badkey": ["--cuda-graph-config", '{"decode":{"backend":"layerwise","bogus":1}}'],
        "mla": ["--model-path", mla_model, "--cuda-graph-backend-decode", "layerwise",
                "--cuda-graph-backend-prefill", "layerwise"],
        "mla_upstream": ["--model-path", mla_model, "--cuda-graph-backend-decode", "full"],
    }
    # The MLA scenarios resolve prefill as on a CUDA host (breakable is upstream's default there;
    # this process sees no GPU, where the default would be tc_piecewise).
    import sglang.srt.model_executor.cuda_graph_config as cgc
    host_default = cgc.default_prefill_backend
    out = {}
    for name, argv in scenarios.items():
        cgc.default_prefill_backend = (lambda: "breakable") if name.startswith("mla") else host_default
        # A flag the base lacks is reported (the legacy piecewise flags must exist on every base).
        missing = [a for a in argv if a.startswith("--") and a not in known]
        if missing:
            out[name] = {"missing_flags": missing}
            continue
        records.clear()
        for k in ("SGLANG_SM120_DYNAMO_FREE", "SGLANG_FLASHINFER_WORKSPACE_SIZE"):
            os.environ.pop(k, None)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                sa = prepare_server_args(base + argv)
        except SystemExit as e:
            out[name] = {"exit": e.code, "stderr": err.getvalue()[-400:]}
            continue
        if hasattr(sa, "resolve_once"):  # 0.5.23: resolution declares values over the raw record
            sa.resolve_once()
            from sglang.srt.arg_groups.model_override_base import resolving_view
            cfg = resolving_view(sa).cuda_graph_config
        else:  # 0.5.16: __post_init__ resolved the record in place
            cfg = sa.cuda_graph_config
        out[name] = {
            "decode": vars(cfg.decode), "prefill": vars(cfg.prefill),
            "dynamo_free": os.environ.get("SGLANG_SM120_DYNAMO_FREE"),
            "workspace": os.environ.get("SGLANG_FLASHINFER_WORKSPACE_SIZE"),
            "log": list(records),
        }
    print("RESULT " + json.dumps(out))
    '''
)

from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG as _QWEN3_30B_CONFIG  # noqa: E402


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory):
    try:
        root, _, _ = buildenv.write_patched_tree(tmp_path_factory.mktemp("patched"))
    except buildenv.UpstreamUnavailable as e:
        pytest.fail(str(e))
    model = tmp_path_factory.mktemp("qwen3_30b_shapes")
    (model / "config.json").write_text(json.dumps(_QWEN3_30B_CONFIG))
    from sglang.sm120.tiny import spec

    mla_model = tmp_path_factory.mktemp("tiny_deepseek_v2")
    mla_config = spec.hf_config(spec.default_spec("deepseek_v2"), {"bos": 1, "eos": 2, "pad": 0})
    (mla_model / "config.json").write_text(json.dumps(mla_config))
    return root, model, mla_model


@pytest.fixture(scope="module")
def scenarios(patched_tree):
    root, model, mla_model = patched_tree
    env = dict(os.environ, PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES="")
    env.pop("SGLANG_SM120_DYNAMO_FREE", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SCENARIOS, str(model), str(mla_model)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"scenario script failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(line[len("RESULT "):])


def test_server_args_layerwise_both_phases(scenarios):
    r = scenarios["both"]
    dec, pre = r["decode"], r["prefill"]
    assert dec["backend"] == pre["backend"] == "layerwise"
    full = [s for s in dec["bs"] if s <= dec["layerwise_full_max_bs"]]
    assert full[:5] == [1, 2, 4, 8, 12] and dec["bs"][-1] == dec["max_bs"] == 1024
    assert pre["bs"][-1] == pre["max_bs"] and pre["full_prefill_max_req"] >= 16
    assert r["dynamo_free"] == "1"
    assert int(r["workspace"]) >= C.flashinfer_decode_workspace_bytes(1024, 32, 4, 128)
    assert any("layerwise CUDA graphs: decode full graphs" in m for m in r["log"])


def test_server_args_every_size_and_json_ceiling(scenarios):
    assert scenarios["every"]["decode"]["layerwise_full_max_bs"] == 0
    assert scenarios["every"]["decode"]["bs"][0] == 1
    assert scenarios["json"]["decode"]["layerwise_full_max_bs"] == 64


def test_server_args_legacy_piecewise_flags(scenarios):
    # every base accepts them (0.5.23 through patch 0002, which restores what it dropped)
    assert not [scenarios[n]["missing_flags"] for n in ("legacy", "maxtok", "disable") if "missing_flags" in scenarios[n]]
    legacy = scenarios["legacy"]
    assert legacy["prefill"]["bs"] == [128, 1024, 4096]
    # 0.5.16: the layerwise backend ignores it; 0.5.23 (no torch.compile backend) ignores it at parse
    assert any("compiler" in m and "ignored" in m for m in legacy["log"]), legacy["log"]
    assert scenarios["maxtok"]["prefill"]["bs"][-1] == 2048
    disable = scenarios["disable"]
    assert disable["decode"]["backend"] == "layerwise" and disable["prefill"]["backend"] == "disabled"


def test_server_args_unsupported_feature_falls_back(scenarios):
    r = scenarios["compile"]
    assert r["decode"]["backend"] == "full" and r["dynamo_free"] is None
    assert any("--enable-torch-compile" in m for m in r["log"])


def test_server_args_mla_prefill_falls_back_to_what_upstream_resolves(scenarios):
    # layerwise's prefill fallback for MLA must land on the backend upstream alone (the
    # correctness control) resolves, with layerwise decode kept. That backend differs by base:
    # 0.5.16 disables breakable prefill for MLA, 0.5.23 keeps it.
    upstream, ours = scenarios["mla_upstream"], scenarios["mla"]
    control = upstream["prefill"]["backend"]
    assert control in ("disabled", "breakable"), upstream
    assert ours["prefill"]["backend"] == control
    assert ours["decode"]["backend"] == "layerwise"
    assert any("MLA attention (prefill)" in m and f"uses {control!r}" in m for m in ours["log"]), ours["log"]


def test_server_args_bad_json_key_names_the_argument(scenarios):
    r = scenarios["badkey"]
    assert r["exit"] == 2 and "--cuda-graph-config" in r["stderr"] and "bogus" in r["stderr"]


def test_server_args_enable_piecewise_selects_layerwise_for_both_phases(scenarios):
    r = scenarios["alias"]
    assert r["prefill"]["backend"] == "layerwise" and r["decode"]["backend"] == "layerwise"
    assert r["dynamo_free"] == "1"


def test_a_malformed_lean_prefill_cap_fails_at_server_args_time(monkeypatch):
    from sglang.sm120.runner import lean_moe

    monkeypatch.setenv(lean_moe.ENV, "1")
    monkeypatch.setenv(lean_moe.PREFILL_CAP_ENV, "4k")
    with pytest.raises(ValueError, match=lean_moe.PREFILL_CAP_ENV):
        C.finalize(_args())
    C.finalize(_args(prefill="disabled"))  # no layerwise prefill: the cap is not read
    monkeypatch.setenv(lean_moe.PREFILL_CAP_ENV, "2048")
    assert C.finalize(_args()).prefill is not None


def test_lean_moe_is_on_by_default_and_a_malformed_switch_fails_at_server_args_time(monkeypatch):
    from sglang.sm120.runner import lean_moe

    monkeypatch.delenv(lean_moe.ENV, raising=False)
    monkeypatch.setenv(lean_moe.PREFILL_CAP_ENV, "4k")  # read because lean is on without asking
    with pytest.raises(ValueError, match=lean_moe.PREFILL_CAP_ENV):
        C.finalize(_args())
    monkeypatch.setenv(lean_moe.ENV, "0")  # off: the cap is not read
    assert C.finalize(_args()).prefill is not None
    monkeypatch.setenv(lean_moe.ENV, "on")
    with pytest.raises(ValueError, match=lean_moe.ENV):
        C.finalize(_args())
    with pytest.raises(ValueError, match=lean_moe.ENV):  # decode-only layerwise checks it too
        C.finalize(_args(prefill="disabled"))


def test_a_malformed_prefill_attention_choice_fails_at_server_args_time(monkeypatch):
    from sglang.sm120.runner import prefill_attention as pa

    monkeypatch.setenv(pa.ENV, "fa4")
    with pytest.raises(ValueError, match=pa.ENV):
        C.finalize(_args())
    C.finalize(_args(prefill="disabled"))  # no layerwise prefill: not read
    monkeypatch.setenv(pa.ENV, "fa3")
    assert C.finalize(_args()).prefill is not None


def test_run_time_config_is_read_where_the_base_keeps_it(monkeypatch):
    """0.5.16 resolves ServerArgs.cuda_graph_config in place; 0.5.23 keeps the raw input on the
    record and publishes the resolved config in the exec.graph bag (upstream_api declares which)."""
    from sglang.sm120 import upstream_api

    bag = SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(decode=_phase("layerwise"))))
    monkeypatch.setattr(upstream_api, "upstream_present", lambda: True)
    monkeypatch.setattr(upstream_api, "has", lambda name: name == "runtime_context.get_exec")
    monkeypatch.setattr(upstream_api, "require", lambda name: (lambda: bag))
    raw_record = SimpleNamespace(cuda_graph_config=None)
    assert C.phase_backend(raw_record, "decode") == "layerwise"
    monkeypatch.setattr(upstream_api, "has", lambda name: False)
    assert C.phase_backend(_args(decode="full"), "decode") == "full"
    assert C.phase_backend(raw_record, "decode") is None


def test_a_missing_server_args_method_is_an_error_not_a_default():
    sa = _args()
    del sa.use_mla_backend
    with pytest.raises(AttributeError, match="use_mla_backend"):
        C.incompatibilities(sa, "prefill")


def test_an_undeclared_or_missing_server_args_field_is_an_error():
    sa = _args()
    with pytest.raises(KeyError, match="not declared"):
        C._get(sa, "no_such_field")
    del sa.enable_torch_compile
    with pytest.raises(AttributeError, match="enable_torch_compile"):
        C.incompatibilities(sa, "decode")
    del sa.cuda_graph_tc_compiler  # a base without it (0.5.23): the declared default
    assert C._get(sa, "cuda_graph_tc_compiler") is None
