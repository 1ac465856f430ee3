"""Patch 0202 and its overlay (sglang.sm120.fp4_moe, fp4_moe_selfcheck, fp4_moe_backend), on CPU:
`--moe-runner-backend sm120` is a CLI choice and an enum member; `auto` for modelopt_fp4 asks the
fork first; ModelOptNvFp4FusedMoEMethod hands create_moe_runner / process_weights_after_loading /
apply to the overlay; the once-per-process self-check and its fallback (fake verify); the per-
layer refusal (marlin for that layer); pack-and-free of a layer's experts; the lean eager MoE
step of an sm120 layer against upstream's FusedMoE.forward_impl. The kernel itself is replaced
by a recording stand-in (no GPU); test/gpu/ runs it."""
from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from installed import skip_module_without_sglang  # noqa: E402

skip_module_without_sglang()

from sglang.sm120 import fp4_moe, fp4_moe_backend, fp4_moe_selfcheck, kernels, selfcheck  # noqa: E402
from sglang.sm120.kernels import moe as kmoe  # noqa: E402
from sglang.sm120.runner import lean_moe  # noqa: E402
from sglang.srt.layers.moe import utils as moe_utils  # noqa: E402
from sglang.srt.layers.moe.utils import MoeRunnerBackend  # noqa: E402
from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod  # noqa: E402

E, H, I, TOPK = 4, 64, 32, 2


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    # the library's presence is not what these tests decide (test_the_flag_needs_the_library is)
    monkeypatch.setattr(kernels, "available", lambda: True)
    fp4_moe_selfcheck.reset_for_tests()
    monkeypatch.setattr(fp4_moe_backend, "_disabled_reason", None)
    flags = moe_utils.get_flags().moe
    saved = flags.runner_backend
    yield
    flags.runner_backend = saved
    fp4_moe_selfcheck.reset_for_tests()


def set_backend(name):
    moe_utils.get_flags().moe.runner_backend = MoeRunnerBackend(name)


# ------------------------------------------------------------------------------------------------
# the flag
# ------------------------------------------------------------------------------------------------
CLI_SCRIPT = textwrap.dedent(
    """
    import argparse
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    value = p.parse_args(["--model-path", "m", "--moe-runner-backend", "sm120"]).moe_runner_backend
    assert value == "sm120" and MoeRunnerBackend(value) is MoeRunnerBackend.SM120
    assert MoeRunnerBackend(value).is_sm120() and not MoeRunnerBackend.MARLIN.is_sm120()
    help_text = next(a.help for a in p._actions if "--moe-runner-backend" in a.option_strings)
    for words in ("'sm120': its grouped NVFP4 W4A16 MoE kernel", "ModelOpt NVFP4", "SM90 and SM120",
                  "'auto' on SM120", "self-check", "upstream's choice (flashinfer_cutlass)"):
        assert words in help_text, help_text
    print("CLI-OK")
    """
)


def test_the_flag_is_a_cli_choice_and_resolves_to_the_enum_member():
    proc = subprocess.run([sys.executable, "-c", CLI_SCRIPT], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0 and "CLI-OK" in proc.stdout, proc.stderr[-3000:]


def test_auto_for_modelopt_fp4_takes_the_forks_choice_first(monkeypatch):
    from sglang.srt.arg_groups.overrides import _moe_runner_backend_quant_constraints as resolve

    view = SimpleNamespace(moe_runner_backend="auto", quantization="modelopt_fp4", moe_a2a_backend="none")
    monkeypatch.setattr(fp4_moe_backend, "auto_moe_backend_choice", lambda: "sm120")
    assert resolve(view) == {"moe_runner_backend": "sm120"}
    for other in (SimpleNamespace(**dict(vars(view), moe_runner_backend="marlin")),
                  SimpleNamespace(**dict(vars(view), quantization="fp8"))):
        assert resolve(other).get("moe_runner_backend") != "sm120"  # explicit choices and other quants stand
    monkeypatch.setattr(fp4_moe_backend, "auto_moe_backend_choice", lambda: None)
    assert resolve(view).get("moe_runner_backend", "auto") != "sm120"


def test_auto_choice_needs_an_sm120_gpu_with_kernels_and_no_failed_check(monkeypatch):
    from sglang.sm120 import fp4_backend

    seen = []
    monkeypatch.setattr(fp4_backend, "sm120_gpu_with_kernels", lambda serves: seen.append(serves) or True)
    assert fp4_moe_backend.auto_moe_backend_choice() == "sm120" and seen == ["NVFP4 MoE layers"]
    monkeypatch.setattr(fp4_backend, "sm120_gpu_with_kernels", lambda serves: False)
    assert fp4_moe_backend.auto_moe_backend_choice() is None
    monkeypatch.setattr(fp4_backend, "sm120_gpu_with_kernels", lambda serves: True)
    monkeypatch.setattr(fp4_moe_backend, "_disabled_reason", "self-check failed")
    assert fp4_moe_backend.auto_moe_backend_choice() is None


def test_upstream_choice_is_upstreams_resolution_without_the_fork(monkeypatch):
    from sglang.sm120 import fp4_backend

    monkeypatch.setattr(fp4_backend, "sm120_gpu_with_kernels", lambda serves: True)  # would pick sm120
    choice = fp4_moe_backend.upstream_moe_choice()
    assert choice != "sm120" and MoeRunnerBackend(choice) is not None
    assert fp4_moe_backend._disabled_reason is None  # restored after asking
    assert fp4_moe_backend.fall_back_to_upstream("bad") == choice
    assert moe_utils.get_moe_runner_backend().value == choice and fp4_moe_backend.auto_moe_backend_choice() is None


# ------------------------------------------------------------------------------------------------
# a ModelOpt NVFP4 MoE layer as upstream loads it (stand-in module, real tensors)
# ------------------------------------------------------------------------------------------------
def config(**kw):
    base = dict(num_experts=E, num_local_experts=E, hidden_size=H, intermediate_size_per_partition=I,
                top_k=TOPK, params_dtype=torch.bfloat16, activation="silu")
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    return MoeRunnerConfig(**dict(base, **kw))


def nvfp4_layer(e=E, h=H, i=I, seed=0):
    layer = torch.nn.Module()
    for name, t in kmoe.synthetic_experts(e, h, i, "cpu", seed=seed).items():
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    layer.layer_id = 3
    return layer


def test_pack_and_free_a_layers_experts_on_cpu():
    layer = nvfp4_layer()
    loaded = {n: getattr(layer, n).data.clone() for n in fp4_moe.EXPERT_TENSORS}
    fp4_moe.process_weights_after_loading(layer)
    want = kmoe.pack_experts(**loaded)
    got = layer.sm120_experts
    assert (got.num_experts, got.hidden, got.intermediate) == (E, H, I)
    for name in ("w13", "w13_scales", "w13_alpha", "w2", "w2_scales", "w2_alpha"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    # gate rows come first in the loaded tensor: the packed gate_up holds them where the kernel reads gate
    assert torch.equal(kmoe.interleave_gate_up(loaded["w13_weight"], I)[:, :32], loaded["w13_weight"][:, :32])
    for name in fp4_moe.EXPERT_TENSORS:  # freed, parameters kept
        assert getattr(layer, name).numel() == 0 and getattr(layer, name).dtype == loaded[name].dtype
    assert got.nbytes() >= sum(t.numel() * t.element_size() for t in loaded.values()) - 64


def _dummy_load(layer):
    """What upstream's initialize_dummy_weights does to every float parameter (fp8 via fp16)."""
    from sglang.srt.model_loader.weight_utils import initialize_dummy_weights

    initialize_dummy_weights(layer)


def test_dummy_loaded_scales_pack_by_magnitude_with_one_warning(monkeypatch, caplog):
    from sglang.sm120 import fp4_layer

    monkeypatch.setattr(fp4_layer, "_placeholder_warned", False)
    layer = nvfp4_layer()
    _dummy_load(layer)
    raw = layer.w13_weight_scale.data.view(torch.uint8)
    assert bool((raw > 0x80).any())  # what the packers refuse (0.5.16 also writes global scales <= 0; 0.5.23 sets 1)
    with pytest.raises(ValueError, match="must be finite and > 0|negative block scales"):
        kmoe.pack_experts(**{n: getattr(layer, n).data for n in fp4_moe.EXPERT_TENSORS})
    loaded = {n: getattr(layer, n).data.clone() for n in fp4_moe.EXPERT_TENSORS}
    second = nvfp4_layer(seed=1)
    _dummy_load(second)
    with caplog.at_level(logging.WARNING, logger=fp4_layer.__name__):
        fp4_moe.process_weights_after_loading(layer)
        fp4_moe.process_weights_after_loading(second)  # the second layer packs without a second line
    assert len([r for r in caplog.records if "--load-format dummy" in r.getMessage()]) == 1
    want = kmoe.pack_experts(
        **dict(loaded, w13_weight_scale=(loaded["w13_weight_scale"].view(torch.uint8) & 0x7F).view(torch.float8_e4m3fn),
               w2_weight_scale=(loaded["w2_weight_scale"].view(torch.uint8) & 0x7F).view(torch.float8_e4m3fn),
               w13_weight_scale_2=torch.where(loaded["w13_weight_scale_2"] == 0, 1.0, loaded["w13_weight_scale_2"].abs()),
               w2_weight_scale_2=torch.where(loaded["w2_weight_scale_2"] == 0, 1.0, loaded["w2_weight_scale_2"].abs())))
    for name in ("w13_scales", "w13_alpha", "w2_scales", "w2_alpha"):
        assert torch.equal(getattr(layer.sm120_experts, name).view(torch.uint8), getattr(want, name).view(torch.uint8)), name


def test_checkpoint_scales_pass_untouched():
    from sglang.sm120 import fp4_layer

    w = kmoe.synthetic_experts(2, 64, 32, "cpu")
    s, g = fp4_layer.packable_scales(w["w2_weight_scale"], w["w2_weight_scale_2"], "x")
    assert s is w["w2_weight_scale"] and g is w["w2_weight_scale_2"]


@pytest.mark.parametrize("change,why", [
    (dict(activation="gelu"), "activation 'gelu'"),
    (dict(is_gated=False), "gated=False"),
    (dict(swiglu_limit=7.0), "swiglu_limit"),
    (dict(apply_router_weight_on_input=True), "apply_router_weight_on_input"),
    (dict(no_combine=True), "no_combine"),
    (dict(params_dtype=torch.float16), "torch.float16"),
])
def test_layer_refusal_names_what_the_kernel_does_not_run(change, why):
    assert fp4_moe.layer_refusal(nvfp4_layer(), config()) is None
    assert why in fp4_moe.layer_refusal(nvfp4_layer(), config(**change))


def test_a_refused_layer_runs_marlin_alone_without_the_check(monkeypatch, caplog):
    monkeypatch.setattr(fp4_moe_selfcheck, "verify_shape", lambda *a: pytest.fail("checked a refused layer"))
    set_backend("sm120")
    with caplog.at_level(logging.WARNING, logger=fp4_moe.__name__):
        assert fp4_moe.layer_backend(nvfp4_layer(), config(activation="relu2")) is MoeRunnerBackend.MARLIN
    assert moe_utils.get_moe_runner_backend().is_sm120()  # the process keeps sm120
    assert len(caplog.records) == 1 and "marlin" in caplog.records[0].getMessage()
    assert fp4_moe_selfcheck.outcome() is None


def test_the_flag_needs_the_library(monkeypatch):
    def missing():
        raise RuntimeError("libsm120_kernels.so not found")

    monkeypatch.setattr(kernels, "available", lambda: False)
    monkeypatch.setattr(kernels, "load", missing)
    set_backend("sm120")
    with pytest.raises(RuntimeError, match="--moe-runner-backend sm120 needs libsm120_kernels.so: .*not found"):
        fp4_moe.layer_backend(nvfp4_layer(), config())


def _outcome(ok, **kw):
    return fp4_moe_selfcheck.MoeOutcome(ok, E, H, I, E, TOPK, (1, 16, 96), 0.01, **kw)


def test_the_check_runs_once_on_the_first_layers_shapes(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(fp4_moe_selfcheck, "verify_shape", lambda *a: calls.append(a[:4]) or _outcome(True))
    monkeypatch.setattr(fp4_moe, "_check_device", lambda layer: torch.device("cpu"))
    set_backend("sm120")
    with caplog.at_level(logging.INFO, logger=fp4_moe_selfcheck.__name__):
        assert fp4_moe.layer_backend(nvfp4_layer(), config()) is MoeRunnerBackend.SM120
        assert fp4_moe.layer_backend(nvfp4_layer(e=2, h=32, i=16), config()) is MoeRunnerBackend.SM120
    assert calls == [(E, H, I, TOPK)]
    lines = [r for r in caplog.records if r.name == fp4_moe_selfcheck.__name__]
    assert len(lines) == 1 and "passed" in lines[0].getMessage() and f"E={E} H={H} I={I}" in lines[0].getMessage()


def test_a_failed_check_hands_this_layer_and_the_process_to_upstreams_choice(monkeypatch, caplog):
    monkeypatch.setattr(fp4_moe_selfcheck, "verify_shape", lambda *a: _outcome(
        False, case=16, path="topk", error="1 of 1024 outside tolerance"))
    monkeypatch.setattr(fp4_moe, "_check_device", lambda layer: torch.device("cpu"))
    set_backend("sm120")
    upstream = fp4_moe_backend.upstream_moe_choice()
    with caplog.at_level(logging.INFO, logger=fp4_moe_selfcheck.__name__):
        first = fp4_moe.layer_backend(nvfp4_layer(), config())
        later = fp4_moe.layer_backend(nvfp4_layer(), config())
    assert first.value == later.value == upstream == moe_utils.get_moe_runner_backend().value
    lines = [r for r in caplog.records if r.name == fp4_moe_selfcheck.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    for part in (f"E={E} H={H} I={I}", "tokens=16", "topk", "outside tolerance", upstream):
        assert part in lines[0].getMessage(), lines[0].getMessage()
    assert fp4_moe_selfcheck.outcome().fallback == upstream


# ------------------------------------------------------------------------------------------------
# the shared machinery and the MoE tolerance
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw,site", [(None, ""), ("moe", "moe"), (" MOE ", "moe"), ("gemm", "gemm")])
def test_fault_sites(env_value, raw, site):
    env_value(selfcheck.FAULT_INJECT_ENV, raw)
    assert selfcheck.fault_site() == site


def test_an_unknown_fault_site_names_the_variable_and_the_sites(env_value):
    env_value(selfcheck.FAULT_INJECT_ENV, "experts")
    with pytest.raises(ValueError, match="SGLANG_SM120_FAULT_INJECT must be one of gemm, moe"):
        selfcheck.fault_site()


def test_both_checks_share_one_machinery():
    from sglang.sm120 import fp4_selfcheck

    assert fp4_selfcheck.fault_site is selfcheck.fault_site is fp4_moe_selfcheck.fault_site
    assert isinstance(fp4_selfcheck._check, selfcheck.OnceCheck) and isinstance(fp4_moe_selfcheck._check, selfcheck.OnceCheck)
    assert fp4_selfcheck._check is not fp4_moe_selfcheck._check  # separate decisions


def test_the_moe_tolerance_passes_the_reference_and_catches_the_injected_fault():
    w = kmoe.synthetic_experts(E, H, I, "cpu", seed=1, std=0.5)
    ids, weights = kmoe.synthetic_routing(8, TOPK, E, "cpu", seed=2)
    x = torch.randn(8, H, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = kmoe.moe_reference(x, ids, weights, **w)
    assert fp4_moe_selfcheck.compare(ref, ref) is None
    one_ulp = (ref.float() * (1 + 2.0 ** -8)).to(torch.bfloat16)
    assert fp4_moe_selfcheck.compare(one_ulp, ref) is None
    assert "1 of" in fp4_moe_selfcheck.compare(selfcheck.corrupt_one(ref), ref)
    dropped = kmoe.moe_reference(x, ids.masked_fill(ids == 0, -1), weights, **w)  # one expert left out
    assert fp4_moe_selfcheck.compare(dropped, ref) is not None


@pytest.fixture
def reference_kernel(monkeypatch):
    """verify_shape on CPU: pack_experts keeps the ModelOpt tensors and moe_w4a16 is moe_reference
    on them (the packing and the kernel are tested elsewhere; here the check's cases, routing,
    comparison and fault injection run for real)."""
    calls = []
    monkeypatch.setattr(kmoe, "pack_experts", lambda **w: w)

    def kernel(x, ids, weights, packed):
        calls.append((x.shape[0], ids.clone()))
        return kmoe.moe_reference(x, ids, weights, **packed)

    monkeypatch.setattr(kmoe, "moe_w4a16", kernel)
    return calls


def test_verify_shape_runs_every_case_within_the_tolerance(reference_kernel, env_value):
    env_value(selfcheck.FAULT_INJECT_ENV, None)
    res = fp4_moe_selfcheck.verify_shape(12, H, I, 4, "cpu")
    assert res.ok, res.failure()
    assert res.checked_experts == fp4_moe_selfcheck.MAX_CHECK_EXPERTS and res.topk == 4
    tokens = [t for t, _ in reference_kernel]
    assert tokens == [1, 16, 96]
    topk_case, ep_case = reference_kernel[1][1], reference_kernel[2][1]
    assert set(topk_case.unique().tolist()) <= set(range(4))  # experts 4..7 get zero rows
    assert bool((ep_case == -1).any())  # other ranks' experts


def test_the_injected_moe_fault_fails_the_check_and_hands_the_process_to_upstream(reference_kernel, env_value):
    env_value(selfcheck.FAULT_INJECT_ENV, "moe")
    set_backend("sm120")
    res = fp4_moe_selfcheck.ensure_verified(E, H, I, TOPK, "cpu")
    assert not res.ok and res.case == 1 and "outside tolerance" in res.error
    assert res.fallback == fp4_moe_backend.upstream_moe_choice() == moe_utils.get_moe_runner_backend().value
    env_value(selfcheck.FAULT_INJECT_ENV, "gemm")  # the GEMM check's site leaves this one alone
    assert fp4_moe_selfcheck.verify_shape(E, H, I, TOPK, "cpu").ok


# ------------------------------------------------------------------------------------------------
# the quant method's hooks (patch 0202) and apply's kernel call
# ------------------------------------------------------------------------------------------------
class KernelStandIn:
    """Records moe_w4a16's calls; writes a function of every argument into out."""

    def __init__(self):
        self.calls = []

    def __call__(self, hidden_states, topk_ids, topk_weights, experts, *, routed_scaling_factor=1.0,
                 out=None, scratch=None):
        self.calls.append(dict(hidden_states=hidden_states, topk_ids=topk_ids, topk_weights=topk_weights,
                               experts=experts, routed_scaling_factor=routed_scaling_factor, out=out,
                               scratch=scratch))
        y = (hidden_states.float() * (topk_weights.sum(1, keepdim=True) * routed_scaling_factor)
             + topk_ids.float().sum(1, keepdim=True) + experts.w2_alpha.sum()).to(torch.bfloat16)
        if out is None:
            return y
        out.copy_(y)
        return out


def method_with(backend):
    m = new_method()
    m._moe_runner_backend = backend
    return m


def new_method():
    """The quant method without its constructor (which checks the GPU); a Module, as upstream's is."""
    m = ModelOptNvFp4FusedMoEMethod.__new__(ModelOptNvFp4FusedMoEMethod)
    if isinstance(m, torch.nn.Module):
        torch.nn.Module.__init__(m)
    return m


def test_the_quant_methods_hooks_route_sm120_layers_to_the_overlay(monkeypatch):
    seen = []
    monkeypatch.setattr(fp4_moe, "layer_backend", lambda layer, cfg: seen.append("backend") or MoeRunnerBackend.SM120)
    monkeypatch.setattr(fp4_moe, "process_weights_after_loading", lambda layer: seen.append("process"))
    monkeypatch.setattr(fp4_moe, "apply", lambda layer, d: seen.append("apply") or "combined")
    set_backend("sm120")
    m = new_method()
    layer = nvfp4_layer()
    layer._mega_moe_nvfp4 = False  # 0.5.23's apply reads it first
    m.create_moe_runner(layer, config())
    assert m._moe_runner_backend is MoeRunnerBackend.SM120 and m.runner is None
    m.process_weights_after_loading(layer)
    assert m.apply(layer, SimpleNamespace()) == "combined"
    assert seen == ["backend", "process", "apply"]


def test_a_layer_the_overlay_hands_back_gets_upstreams_marlin_runner(monkeypatch):
    monkeypatch.setattr(fp4_moe, "layer_backend", lambda layer, cfg: MoeRunnerBackend.MARLIN)
    monkeypatch.setattr(fp4_moe, "process_weights_after_loading", lambda layer: pytest.fail("overlay reached"))
    set_backend("sm120")
    m = new_method()
    m.create_moe_runner(nvfp4_layer(), config(routed_scaling_factor=2.5))
    assert m._moe_runner_backend.is_marlin() and m.runner.runner_backend.is_marlin()
    assert m.runner.config.routed_scaling_factor is None  # patch 0301: folded into top-k once


@pytest.mark.parametrize("fused,rsf,want", [(True, 2.5, 1.0), (False, 2.5, 2.5), (False, None, 1.0)])
def test_apply_runs_the_kernel_on_upstreams_topk_with_upstreams_scaling(monkeypatch, fused, rsf, want):
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput, StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    stand_in = KernelStandIn()
    monkeypatch.setattr(kernels, "moe_w4a16", stand_in)
    layer = nvfp4_layer()
    fp4_moe.process_weights_after_loading(layer)
    layer.should_fuse_routed_scaling_factor_in_topk = fused
    layer.moe_runner_config = config(routed_scaling_factor=rsf)
    x = torch.randn(5, H).to(torch.bfloat16)
    ids, w = kmoe.synthetic_routing(5, TOPK, E, "cpu")
    ids[0, 0] = -1  # another rank's expert, as upstream's EP dispatcher maps it
    topk = StandardTopKOutput(w, ids, None)
    res = fp4_moe.apply(layer, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None, topk_output=topk))
    assert isinstance(res, StandardCombineInput)
    (call,) = stand_in.calls
    assert call["hidden_states"] is x and call["topk_ids"] is ids and call["topk_weights"] is w
    assert call["experts"] is layer.sm120_experts and call["routed_scaling_factor"] == want
    assert call["out"] is None and call["scratch"] is None


def test_an_empty_batch_launches_nothing(monkeypatch):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    monkeypatch.setattr(kernels, "moe_w4a16", lambda *a, **kw: pytest.fail("launched on no tokens"))
    layer = nvfp4_layer()
    fp4_moe.process_weights_after_loading(layer)
    empty = torch.empty(0, H, dtype=torch.bfloat16)
    topk = StandardTopKOutput(torch.empty(0, TOPK), torch.empty(0, TOPK, dtype=torch.int32), None)
    assert fp4_moe.run(layer, empty, topk).shape == (0, H)


def test_scratch_gives_views_of_shared_buffers_and_grows():
    s = kmoe.MoeScratch("cpu")
    a = s.take("act", (4, 8), torch.bfloat16)
    b = s.take("act", (2, 8), torch.bfloat16)
    assert a.data_ptr() == b.data_ptr() and s.nbytes == 4 * 8 * 2
    c = s.take("act", (8, 8), torch.bfloat16)
    assert c.shape == (8, 8) and s.nbytes == 8 * 8 * 2
    s.scrub()
    assert bool(torch.isnan(c.float()).all())


def test_a_scratch_made_for_bare_cuda_is_on_the_current_device(monkeypatch):
    # the runner passes its device as 'cuda'; inputs are on 'cuda:N', and a scratch left on bare
    # 'cuda' was refused at every lean sm120 step (H100, session 2026-12-05b: every row count's
    # warm failed, replays fell back to padded rows on upstream's path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert kmoe.MoeScratch("cuda").device == torch.device("cuda", 3)
    assert kmoe.MoeScratch("cuda:1").device == torch.device("cuda", 1)
    assert kmoe.MoeScratch("cpu").device == torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# the lean eager MoE step of an sm120 layer, against upstream's FusedMoE.forward_impl
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def sm120_moe(monkeypatch):
    """A real FusedMoE (moe_layer.make_layer) whose quant method is ModelOpt NVFP4 on sm120, its
    experts packed; the kernel is the recording stand-in, parallel state one rank."""
    from moe_layer import make_layer
    from sglang.srt.layers.moe.fused_moe_triton import layer as layer_mod

    stand_in = KernelStandIn()
    monkeypatch.setattr(kernels, "moe_w4a16", stand_in)
    # parallel state upstream's combine consults: one rank, no symmetric memory (named per base)
    monkeypatch.setattr(layer_mod, "get_tp_group", lambda: None, raising=False)
    if hasattr(layer_mod, "get_parallel"):
        monkeypatch.setattr(layer_mod, "get_parallel", lambda: SimpleNamespace(tp_group=None))
    monkeypatch.setattr(layer_mod, "use_symmetric_memory", lambda *a, **kw: contextlib.nullcontext())
    set_backend("sm120")
    layer = make_layer(E=E, H=H, inter=I, topk=TOPK, rsf=2.5)
    src = nvfp4_layer()
    for name in fp4_moe.EXPERT_TENSORS:
        setattr(layer, name, getattr(src, name))
    fp4_moe.process_weights_after_loading(layer)
    qm = method_with(MoeRunnerBackend.SM120)
    qm.moe_runner_config = layer.moe_runner_config
    del layer.quant_method  # make_layer's is a registered child Module; ModelOpt's is a plain object
    layer.quant_method = qm
    layer.should_fuse_routed_scaling_factor_in_topk = True
    layer._mega_moe_nvfp4 = layer._dwdp_bound = False  # 0.5.23's forward_impl / apply read them
    return layer, stand_in


def inputs(rows, seed=1):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, H, generator=g).to(torch.bfloat16)
    ids, w = kmoe.synthetic_routing(rows, TOPK, E, "cpu", seed=seed)
    return x, StandardTopKOutput(w, ids, None)


def test_lean_step_of_an_sm120_layer_is_the_same_kernel_call_as_upstreams_path(sm120_moe):
    layer, stand_in = sm120_moe
    assert lean_moe.layer_refusal(layer) is None  # on either base: no Triton launches reproduced
    lean = lean_moe.LeanMoe("cpu")
    for rows in (3, 7):
        x, topk = inputs(rows, seed=rows)
        step, out = lean.bind(layer, (x, topk), {})
        step.scrub()
        step()
        want = layer.forward_impl(x, topk)
        assert torch.equal(out, want)
        lean_call, upstream_call = stand_in.calls[-2:]
        for key in ("hidden_states", "topk_ids", "topk_weights", "experts", "routed_scaling_factor"):
            assert lean_call[key] is upstream_call[key] or lean_call[key] == upstream_call[key], key
        assert lean_call["out"] is out and lean_call["scratch"] is lean.moe_scratch
        assert upstream_call["out"] is None and upstream_call["scratch"] is None
    # step.sm120: the capture report counts these steps (the GPU grid asserts the backend ran)
    assert step.lean and step.sm120 and step.triton_resolved() == [] and "sm120" in step.owner_name


@pytest.mark.parametrize("change,why", [
    (lambda l: setattr(l, "moe_ep_size", 2), "expert parallelism"),
    (lambda l: (setattr(l, "reduce_results", True), setattr(l, "moe_tp_size", 2)), "all-reduces"),
    (lambda l: setattr(l, "dispatcher", object()), "dispatcher object"),
    (lambda l: setattr(l, "_dwdp_bound", True), "DWDP"),
])
def test_lean_gate_refuses_an_sm120_layer_whose_forward_does_more(sm120_moe, change, why):
    layer, _ = sm120_moe
    change(layer)
    assert why in lean_moe.layer_refusal(layer)


def test_lean_gate_refuses_calls_the_kernel_would_not_take_as_they_are(sm120_moe, caplog):
    layer, _ = sm120_moe
    x, topk = inputs(4)
    assert lean_moe.call_refusal(layer, x, topk) is None
    assert "bf16" in lean_moe.call_refusal(layer, x.half(), topk)
    assert "hidden size" in lean_moe.call_refusal(layer, torch.zeros(4, 2 * H, dtype=torch.bfloat16), topk)
    lean = lean_moe.LeanMoe("cpu")
    with caplog.at_level(logging.INFO, logger=lean_moe.__name__):
        assert lean.bind(layer, (x.half(), topk), {}) is None
    assert any("bf16" in r.getMessage() for r in caplog.records)


def test_nvfp4_layers_on_other_backends_still_keep_upstreams_path(sm120_moe):
    layer, _ = sm120_moe
    layer.quant_method = method_with(MoeRunnerBackend.MARLIN)
    why = lean_moe.layer_refusal(layer)
    assert why is not None and ("ModelOptNvFp4FusedMoEMethod" in why or "not ported" in why), why
