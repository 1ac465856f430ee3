"""The lean eager MoE step (runner/lean_moe.py) against upstream's own FusedMoE.forward, on CPU,
on whichever base is installed (0.5.16 or 0.5.23).

The kernel entry points both paths call (moe_align_block_size and, on 0.5.23, its single-CTA
small-numel align, invoke_fused_moe_kernel, silu/gelu_and_mul, moe_sum_reduce, the sum helper,
0.5.23's Triton sum, torch.add) are replaced by recording stand-ins that also compute the MoE in
plain torch, and a real FusedMoE is assembled by hand (upstream's classes, attributes set as its
constructor would for the unquantized Triton path).
Checks: the lean step makes the same launches with the same arguments in the same order and the
same result; its buffers are shared by layers and sizes; the gate refuses what it does not
reproduce, with one log line per reason; the probe falls back to upstream's path for a size
whose lean result differs, and captured replays are lean and equal to upstream's eager output.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("sglang.srt.layers.moe.fused_moe_triton.layer")
try:
    from sglang.sm120.runner import lean_moe
except ImportError:  # an installed fork that predates it shadows the checkout
    if os.environ.get("SGLANG_SM120_REQUIRE_INSTALLED") == "1":
        raise
    pytest.skip("the installed sglang.sm120 has no runner.lean_moe: build + install the checkout "
                "(tools/run_tests.sh) or put a tree with it first on PYTHONPATH", allow_module_level=True)

from sglang.sm120 import upstream_api  # noqa: E402

# The lean step reproduces one base's MoE launches; on the others the gate keeps upstream's path
# (test_the_gate_refuses_bases_the_step_is_not_ported_to, in test_upstream_api.py).
pytestmark = pytest.mark.skipif(
    upstream_api.check_installed() not in lean_moe.LEAN_STEP_BASES,
    reason=f"lean MoE step not ported to upstream sglang {upstream_api.check_installed()}",
)

from sglang.sm120.runner.boundary import StagingArena  # noqa: E402
from cpu_graph import RecordingGraph  # noqa: E402
from moe_layer import make_inputs, make_layer  # noqa: E402
from sglang.sm120.runner.layerwise import capture_size  # noqa: E402
from sglang.sm120.runner.lean_moe import LeanMoe  # noqa: E402
from sglang.srt.layers.moe.fused_moe_triton import layer as layer_mod  # noqa: E402
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE  # noqa: E402
fm, mab = lean_moe._upstream()
from sglang.srt.layers.moe.topk import StandardTopKOutput  # noqa: E402
from sglang.srt.layers.moe.utils import MoeRunnerBackend  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402

CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
          "num_warps": 4, "num_stages": 3}
DOWN_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
               "num_warps": 4, "num_stages": 2}


# ------------------------------------------------------------------------------------------------
# recording stand-ins for the kernels
# ------------------------------------------------------------------------------------------------
ON_0523 = upstream_api.check_installed() == "0.5.23"
REAL_INVOKE = fm.invoke_fused_moe_kernel  # its signature binds the stand-in's arguments


class Kernels:
    """Launch log, plus what the lookups return (TMA on/off, a down config or none, USE_TMA in the
    up config, PDL support)."""

    def __init__(self, mp):
        self.mp = mp
        self.log = []
        self.tma = False
        self.down = False
        self.up_tma = False
        self.pdl = False
        self.up_configs = {}
        self.sig_invoke = inspect.signature(REAL_INVOKE)
        self.stack = contextlib.ExitStack()

    def set_resolved(self, field, value):
        """A resolved server setting, where the installed base keeps it (upstream_api.resolved)."""
        place = upstream_api.RESOLVED_FIELDS[field][upstream_api.check_installed()]
        if place == "record":
            setattr(get_context()._server_args, field, value)
        else:
            from sglang.srt.runtime_context import get_exec

            self.stack.enter_context(getattr(get_exec(), place.split(".", 1)[1]).override(**{field: value}))

    def record(self, name, args):
        self.log.append((name, args))

    # entry points -------------------------------------------------------------------------
    def config_lookup(self, w1_shape, w2_shape, top_k, dtype, M, **kw):
        self.record("try_get_optimal_moe_config", (tuple(w1_shape), tuple(w2_shape), top_k, dtype, M, kw))
        down = dict(DOWN_CONFIG, USE_TMA=True) if self.down else None  # a copy, as upstream's lookup makes
        up = self.up_configs.setdefault(self.up_tma, dict(CONFIG, USE_TMA=True) if self.up_tma else dict(CONFIG))
        return up, (down, 16 if down else None)  # the up config is upstream's cached dict itself

    def align(self, topk_ids, num_experts, block_size, sorted_ids, expert_ids, ntpp, cumsum, pad, ignore):
        self.record("moe_align_block_size", (topk_ids, num_experts, block_size, sorted_ids,
                                             expert_ids, ntpp, cumsum, pad, ignore))
        sorted_ids.fill_(0)
        expert_ids.fill_(0)
        ntpp.fill_(topk_ids.numel())

    def small_align(self, topk_ids, num_experts, block_size, sorted_ids, expert_ids, ntpp, **kw):
        self.record("moe_align_small_numel", (topk_ids, num_experts, block_size, sorted_ids, expert_ids, ntpp, kw))
        sorted_ids.fill_(1)
        expert_ids.fill_(1)
        ntpp.fill_(topk_ids.numel())

    def invoke(self, *args, **kwargs):
        b = self.sig_invoke.bind(*args, **kwargs)
        b.apply_defaults()
        a = b.arguments
        self.record("invoke_fused_moe_kernel", dict(a))
        ids = a["topk_ids"].reshape(-1).long()
        rows = torch.arange(ids.numel()) // a["top_k"]
        A, B = a["A"][rows].float(), a["B"][ids].float()
        res = torch.einsum("rk,rnk->rn", A, B)
        if a["mul_routed_weight"]:
            res = res * a["topk_weights"].reshape(-1, 1).float()
        C = a["C"].view(-1, a["B"].shape[1])
        C[: ids.numel()] = res.to(C.dtype)

    def act(self, name, fn):
        def run(x, out, **kw):
            self.record(name, (x, out, kw))
            d = x.shape[-1] // 2
            out.copy_((fn(x[:, :d].float()) * x[:, d:].float()).to(out.dtype))
        return run

    def sum_reduce(self, x, out, rsf, name="moe_sum_reduce"):
        self.record(name, (x, out, rsf))
        torch.sum(x, dim=1, out=out)
        out.mul_(rsf)

    def sum_helper(self, real):
        def run(x, out, rsf):
            self.record("moe_sum_reduce_torch_compile", (x, out, rsf))
            real(x, out, rsf)
        return run

    def with_out(self, name, real):
        def run(*args, **kwargs):
            if "out" in kwargs:  # only the combine passes out=
                self.record(name, (args, kwargs))
            return real(*args, **kwargs)
        return run


def _op_on_cpu(packet, inplace):
    if not hasattr(packet, "default"):  # 0.5.23: the op's own function, called directly in eager
        return packet.__wrapped__
    names = [a.name for a in packet.default._schema.arguments]

    def call(*args, **kwargs):
        bound = dict(zip(names, args), **kwargs)
        return fm.fused_experts_impl(**bound, inplace=inplace)
    return call


@pytest.fixture
def kernels(monkeypatch):
    k = Kernels(monkeypatch)
    monkeypatch.setenv("SGLANG_SM120_DYNAMO_FREE", "1")  # the sum helper runs eagerly, as in layerwise
    monkeypatch.setattr(fm, "_is_cuda", True)
    monkeypatch.setattr(fm, "try_get_optimal_moe_config", k.config_lookup)
    monkeypatch.setattr(fm, "_moe_support_tma" if ON_0523 else "_down_moe_use_tma", lambda: k.tma)
    monkeypatch.setattr(fm, "is_arch_support_pdl", lambda: k.pdl, raising=False)
    monkeypatch.setattr(fm, "moe_sum_reduce_triton", partial(k.sum_reduce, name="moe_sum_reduce_triton"))
    monkeypatch.setattr(mab, "_is_cuda", True)
    monkeypatch.setattr(mab, "moe_align_small_numel", k.small_align, raising=False)
    if ON_0523:
        from sglang.kernels.ops.moe.moe_align_small_numel import SMALL_NUMEL_LIMIT

        monkeypatch.setattr(mab, "SMALL_NUMEL_LIMIT", SMALL_NUMEL_LIMIT, raising=False)
    monkeypatch.setattr(fm, "invoke_fused_moe_kernel", k.invoke)
    monkeypatch.setattr(fm, "silu_and_mul", k.act("silu_and_mul", F.silu), raising=False)
    monkeypatch.setattr(fm, "gelu_and_mul", k.act("gelu_and_mul", F.gelu), raising=False)
    monkeypatch.setattr(fm, "moe_sum_reduce", k.sum_reduce, raising=False)
    monkeypatch.setattr(fm, "moe_sum_reduce_torch_compile", k.sum_helper(fm.moe_sum_reduce_torch_compile))
    monkeypatch.setattr(mab, "sgl_moe_align_block_size", k.align, raising=False)
    monkeypatch.setattr(torch, "add", k.with_out("torch.add", torch.add))
    monkeypatch.setattr(torch, "sum", k.with_out("torch.sum", torch.sum))
    # torch.ops.sglang registers these two for CUDA only; on CPU, route them by their schema to
    # the function both wrap (upstream's ops add nothing else but the inplace flag)
    for name, inplace in (("inplace_fused_experts", True), ("outplace_fused_experts", False)):
        monkeypatch.setattr(fm, name, _op_on_cpu(getattr(fm, name), inplace))
    # parallel state upstream's combine consults (one rank, no symmetric memory here)
    for mod in (layer_mod, fm):
        monkeypatch.setattr(mod, "get_tp_group", lambda: None, raising=not ON_0523)  # 0.5.23: get_parallel()
        monkeypatch.setattr(mod, "use_symmetric_memory", lambda *a, **kw: contextlib.nullcontext())
    ctx = get_context()
    flags = dict(enable_fused_moe_sum_all_reduce=False, enable_deterministic_inference=False)
    if ON_0523:  # published namespace bags, as a server's, and one rank's parallel state
        k.stack.enter_context(ctx.override_server_args(**flags))
        k.stack.enter_context(get_parallel().override(tp_group=None))
    else:
        saved = ctx._server_args
        ctx._server_args = SimpleNamespace(**flags)
        k.stack.callback(setattr, ctx, "_server_args", saved)
    with k.stack:
        yield k


def _normalize(log, known):
    """Tensors -> (label or '-', shape, dtype, stride); everything else as is."""
    def norm(x):
        if isinstance(x, torch.Tensor):
            return (known.get(id(x), "-"), tuple(x.shape), x.dtype, x.stride())
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(norm(v) for v in x)
        return x
    return [(name, norm(args)) for name, args in log]


def run_both(kernels, layer, rows):
    h, topk = make_inputs(layer, rows)
    known = {id(layer.w13_weight): "w13", id(layer.w2_weight): "w2",
             id(topk.topk_weights): "topk_weights", id(topk.topk_ids): "topk_ids"}
    lean = LeanMoe("cpu")
    step, out = lean.bind(layer, (h.clone(),), {"topk_output": topk})
    kernels.log.clear()
    step()
    lean_log = list(kernels.log)
    kernels.log.clear()
    ref = FusedMoE.forward(layer, h.clone(), topk)  # upstream's whole chain, hook not active
    return lean, out, ref, lean_log, list(kernels.log), known


CASES = {
    "topk2-add": dict(topk=2),
    "topk2-scaled-helper": dict(topk=2, rsf=2.5),
    "topk4-kernel-sum": dict(topk=4, rows=40),  # > 32 tokens: moe_sum_reduce
    "topk4-helper": dict(topk=4, rows=5),       # <= 32 tokens: the (eager) sum helper
    "topk1-direct": dict(topk=1),
    "gelu": dict(topk=2, activation="gelu"),
    "outplace": dict(topk=3, inplace=False),
    "tma-down-config": dict(topk=4, rows=40, tma=True, down=True),  # 0.5.23: the activation's row filter
    "down-config": dict(topk=2, down=True),
    # 0.5.23's own branches (on 0.5.16 upstream asks none of these: the same launches as above)
    "topk4-triton-sum": dict(topk=4, rows=5, pdl=True),   # <= 32 tokens with PDL: moe_sum_reduce_triton
    "up-tma": dict(topk=2, tma=True, up_tma=True),         # USE_TMA in the up config
    "tma-up-and-down": dict(topk=2, tma=True, up_tma=True, down=True),
    "up-tma-unsupported": dict(topk=2, up_tma=True, down=True),  # both popped, neither used
    "small-align": dict(E=70, topk=2, rows=9),            # numel <= 64, > 64 buckets: single-CTA align
    "small-align-at-limit": dict(E=70, topk=4, rows=16),  # numel 64
    "general-align-above-limit": dict(E=70, topk=5, rows=13),  # numel 65
}


def _invokes(log):
    return [a for n, a in log if n == "invoke_fused_moe_kernel"]


# Which of 0.5.23's branches upstream took in a case (the lean step is held to its launches above;
# this holds the case to the branch it is named for).
BRANCH_0523 = {
    "topk4-triton-sum": lambda log: "moe_sum_reduce_triton" in dict(log),
    "topk4-helper": lambda log: "moe_sum_reduce_torch_compile" in dict(log),
    "topk4-kernel-sum": lambda log: "moe_sum_reduce" in dict(log),
    "up-tma": lambda log: _invokes(log)[0]["b_use_tma"] and not _invokes(log)[1]["a_use_tma"],
    "tma-up-and-down": lambda log: _invokes(log)[0]["b_use_tma"] and _invokes(log)[1]["a_use_tma"],
    "up-tma-unsupported": lambda log: not _invokes(log)[0]["b_use_tma"] and not _invokes(log)[1]["a_use_tma"]
    and all("USE_TMA" not in a["config"] for a in _invokes(log)),
    "tma-down-config": lambda log: "sorted_token_ids" in next(a for n, a in log if n == "silu_and_mul")[2],
    "small-align": lambda log: log[0][0] == "moe_align_small_numel",
    "small-align-at-limit": lambda log: log[0][0] == "moe_align_small_numel",
    "general-align-above-limit": lambda log: log[0][0] == "moe_align_block_size",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_launches_same_arguments_same_result(kernels, case):
    c = dict(CASES[case])
    rows = c.pop("rows", 9)
    kernels.tma, kernels.down = c.pop("tma", False), c.pop("down", False)
    kernels.up_tma, kernels.pdl = c.pop("up_tma", False), c.pop("pdl", False)
    layer = make_layer(**c)
    _, out, ref, lean_log, up_log, known = run_both(kernels, layer, rows)
    # upstream looks its config up on every call; the lean plan did so once, with the same arguments
    lookups = [e for e in up_log if e[0] == "try_get_optimal_moe_config"]
    up_launches = [e for e in up_log if e[0] != "try_get_optimal_moe_config"]
    assert not ON_0523 or BRANCH_0523.get(case, lambda log: True)(up_launches)
    # at scaling 1.0 the lean step runs the sum helper's torch.sum but not its mul_(1.0)
    up_launches = [e for e in up_launches if not (e[0] == "moe_sum_reduce_torch_compile" and e[1][2] == 1.0)]
    assert len(lookups) == 1 and not any(e[0] == "try_get_optimal_moe_config" for e in lean_log)
    assert [n for n, _ in lean_log] == [n for n, _ in up_launches]
    assert _normalize(lean_log, known) == _normalize(up_launches, known)
    assert torch.equal(out, ref)
    # the combine (or, at top-k 1, the down GEMM) wrote the caller's buffer: nothing to copy after
    last = lean_log[-1][1]
    dst = last["C"] if lean_log[-1][0] == "invoke_fused_moe_kernel" else (
        last[1]["out"] if lean_log[-1][0] in ("torch.add", "torch.sum") else last[1])
    assert dst.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()


def test_plan_lookup_arguments_match_upstreams(kernels):
    layer = make_layer(topk=4)
    lean = LeanMoe("cpu")
    h, topk = make_inputs(layer, 7)
    kernels.log.clear()
    lean.bind(layer, (h, topk), {})
    lean_lookup = [e for e in kernels.log if e[0] == "try_get_optimal_moe_config"]
    kernels.log.clear()
    FusedMoE.forward(layer, h.clone(), topk)
    assert lean_lookup == [e for e in kernels.log if e[0] == "try_get_optimal_moe_config"]


def test_buffers_shared_by_layers_and_sizes(kernels):
    a, b = make_layer(seed=0), make_layer(seed=5)
    lean = LeanMoe("cpu")
    views = []
    for rows in (64, 64, 8):  # largest first, as sizes are captured
        for layer in (a, b):
            h, topk = make_inputs(layer, rows)
            lean.bind(layer, (h, topk), {})
            views.append(lean._plans)
        if rows == 64:
            bytes_at_largest = lean.workspace.nbytes
    assert lean.workspace.nbytes == bytes_at_largest  # the smaller size allocated nothing
    plans = list(lean._plans.values())
    assert len(plans) == 2  # one per size, shared by both layers
    for field in ("sorted_ids", "expert_ids", "cumsum", "cache1", "cache2", "cache3"):
        ptrs = {getattr(p, field).untyped_storage().data_ptr() for p in plans}
        assert len(ptrs) == 1, field
    big, small = sorted(plans, key=lambda p: -p.rows)
    assert small.cache3.shape == (8, 2, 32) and big.cache3.shape == (64, 2, 32)


def test_plan_lengths_are_upstreams(kernels):
    """Buffer lengths set kernel grids: they must be the lengths upstream allocates."""
    lean = LeanMoe("cpu")
    for E, rows, tma in ((6, 2, False), (6, 40, False), (6, 40, True), (6, 3, False), (70, 3, False),
                         (70, 9, True), (70, 40, False)):
        layer = make_layer(E=E, topk=2)
        kernels.tma = kernels.down = tma
        lean._plans.clear()
        h, topk = make_inputs(layer, rows)
        lean.bind(layer, (h, topk), {})
        (p,) = lean._plans.values()
        kernels.log.clear()
        FusedMoE.forward(layer, h.clone(), topk)
        name, up_align = kernels.log[1]  # after the config lookup
        up_gemm1 = next(a for n, a in kernels.log if n == "invoke_fused_moe_kernel")
        assert p.small_align == (name == "moe_align_small_numel")
        assert p.sorted_ids.shape == up_align[3].shape and p.expert_ids.shape == up_align[4].shape
        assert p.small_align or p.cumsum.shape == up_align[6].shape
        assert p.cache1.shape == up_gemm1["C"].shape


def _set(path, value):
    def apply(layer, inputs, k=None):
        obj = layer
        *parts, last = path.split(".")
        for p in parts:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return apply


REFUSALS = {
    "ep": (_set("moe_ep_size", 2), "expert parallelism"),
    "bias": (_set("w13_weight_bias", torch.zeros(1)), "expert bias"),
    "lora": (_set("quant_method.runner.lora_enabled", True), "LoRA"),
    "backend": (_set("quant_method.runner.runner_backend", MoeRunnerBackend.FLASHINFER_CUTLASS), "only triton"),
    "activation": (_set("moe_runner_config.activation", "relu2"), "activation 'relu2'"),
    "ungated": (_set("moe_runner_config.is_gated", False), "gated=False"),
    "swiglu-limit": (_set("moe_runner_config.swiglu_limit", 10.0), "clamped"),
    "filter": (_set("moe_runner_config.num_local_experts", 3), "expert filtering"),
    "all-reduce": (lambda l, i, k: (_set("reduce_results", True)(l, i), _set("moe_tp_size", 2)(l, i)), "all-reduces"),
    "cpu-dispatch": (lambda l, i, k: setattr(l.quant_method, "_forward_method", l.quant_method.forward_cpu), "forward_cuda"),
    "deterministic": (lambda l, i, k: k.set_resolved("enable_deterministic_inference", True), "deterministic"),
    "fused-sum-ar": (lambda l, i, k: k.set_resolved("enable_fused_moe_sum_all_reduce", True), "fused-moe-sum-all-reduce"),
    "fp32": (lambda l, i, k: i.__setitem__(0, i[0].float()), "only bf16"),
    "topk-format": (lambda l, i, k: i.__setitem__(1, tuple(i[1])), "only StandardTopKOutput"),
}


def _symmetric_memory_on(layer, inputs, k):
    from sglang.srt.distributed.device_communicators import pynccl_allocator
    from sglang.srt import runtime_context

    layer.moe_runner_config.inplace = False
    k.mp.setattr(pynccl_allocator, "is_symmetric_memory_enabled", lambda: True)
    k.mp.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(tp_group=SimpleNamespace(world_size=2)))


def _forced_fused_op_backend(layer, inputs, k):
    from sglang.kernels import fused_op

    k.mp.setattr(fused_op, "_forced_backend", fused_op.KernelBackend.TORCH)


# What 0.5.23's forward does that the lean step does not reproduce (the gate says why).
REFUSALS_0523 = {
    "fuse-swiglu": (_set("quant_method.w13_swiglu_interleaved", True), "fused SwiGLU"),
    "flashinfer-cutlass-flag": (_set("quant_method.use_flashinfer_cutlass", True), "FlashInfer MoE flag"),
    "flashinfer-trtllm-flag": (_set("quant_method.use_flashinfer_trtllm_moe", True), "FlashInfer MoE flag"),
    "dwdp": (_set("_dwdp_bound", True), "DWDP"),
    "symmetric-output": (_symmetric_memory_on, "symmetric memory"),
    "forced-fused-op-backend": (_forced_fused_op_backend, "SGLANG_FORCE_FUSED_OP_BACKEND"),
    "unresolved-forward-on-cpu": (_set("quant_method._forward_method", None), "forward_cuda"),
    "activation-silu-rounded": (_set("moe_runner_config.activation", "silu_rounded"), "activation 'silu_rounded'"),
    "activation-gelu-tanh": (_set("moe_runner_config.activation", "gelu_tanh"), "activation 'gelu_tanh'"),
}
REFUSALS.update({f"0.5.23-{name}": case for name, case in REFUSALS_0523.items()})


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_gate_refuses_with_one_log_line(kernels, case, caplog):
    if case.startswith("0.5.23-") and not ON_0523:
        pytest.skip("0.5.23's own refusals")
    mutate, reason = REFUSALS[case]
    layer = make_layer()
    inputs = list(make_inputs(layer, 4))
    mutate(layer, inputs, kernels)
    lean = LeanMoe("cpu")
    with caplog.at_level(logging.INFO, logger=lean_moe.__name__):
        assert lean.bind(layer, tuple(inputs), {}) is None
        assert lean.bind(layer, tuple(inputs), {}) is None
    lines = [r.getMessage() for r in caplog.records if r.name == lean_moe.__name__]
    assert len(lines) == 1 and reason in lines[0], lines
    assert sum(lean.refusals.values()) == 2


def test_gate_accepts_the_plain_path(kernels):
    layer = make_layer()
    assert lean_moe.layer_refusal(layer) is None
    h, topk = make_inputs(layer, 3)
    assert lean_moe.call_refusal(layer, h, topk) is None


def test_a_forward_not_resolved_yet_is_resolved_as_upstream_resolves_it(kernels, monkeypatch):
    """0.5.23 picks the quant method's forward at its first call; a lean step bound before that
    asks upstream's resolver, as the first call will."""
    if not ON_0523:
        pytest.skip("0.5.16 picks it at construction")
    layer = make_layer()
    qm = layer.quant_method
    qm._forward_method = None
    monkeypatch.setattr(qm, "_resolve_forward_method", lambda: qm.forward_cuda, raising=False)
    assert lean_moe.layer_refusal(layer) is None and qm._forward_method is None


def test_an_inplace_layer_with_symmetric_memory_is_taken(kernels):
    """Upstream writes an in-place layer's output into its input: nothing in the symmetric pool."""
    if not ON_0523:
        pytest.skip("0.5.23's refusal")
    layer = make_layer()
    _symmetric_memory_on(layer, None, kernels)
    assert "symmetric memory" in lean_moe.layer_refusal(layer)
    layer.moe_runner_config.inplace = True
    assert lean_moe.layer_refusal(layer) is None


def test_on_by_default_off_with_0_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.delenv(lean_moe.ENV, raising=False)
    assert lean_moe.lean_moe_requested()
    monkeypatch.setenv(lean_moe.ENV, "1")
    assert lean_moe.lean_moe_requested()
    monkeypatch.setenv(lean_moe.ENV, "0")
    assert not lean_moe.lean_moe_requested()
    monkeypatch.setenv(lean_moe.ENV, "yes")
    with pytest.raises(ValueError, match=lean_moe.ENV):
        lean_moe.lean_moe_requested()


# ------------------------------------------------------------------------------------------------
# through the boundary: probe, capture, replay
# ------------------------------------------------------------------------------------------------
class ToyMoeModel(torch.nn.Module):
    """Router and residual in the segments, the real FusedMoE (hooked by patch 0105) between."""

    def __init__(self, layers=2, E=6, H=32, topk=2):
        super().__init__()
        self.experts = torch.nn.ModuleList(make_layer(E=E, H=H, topk=topk, seed=i) for i in range(layers))
        g = torch.Generator().manual_seed(7)
        self.gates = [torch.randn(H, E, generator=g).to(torch.bfloat16) for _ in range(layers)]
        self.topk = topk

    def forward(self, x):
        h = x
        for experts, gate in zip(self.experts, self.gates):
            logits = (h @ gate).float()
            w, ids = torch.topk(torch.softmax(logits, -1), self.topk, dim=-1)
            residual = h * 1.0  # upstream's MoE is in place: eager would overwrite h itself
            out = experts(h, StandardTopKOutput(w, ids.to(torch.int32), logits))
            h = residual + out
        return h * 1.0


def _capture(model, static_x, rows, lean):
    with torch.no_grad():
        return capture_size(lambda: model(static_x[:rows]), arena=StagingArena(static_x.shape[0], "cpu"),
                            warmups=1, graph_factory=RecordingGraph, lean=lean)


def _eager(model, x):
    with torch.no_grad():
        return model(x)


def test_replay_is_lean_and_equals_upstream(kernels, monkeypatch):
    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    lean = LeanMoe("cpu")
    entries = {rows: _capture(model, static_x, rows, lean) for rows in (12, 5)}
    upstream_calls = []
    real_impl = FusedMoE.forward_impl
    monkeypatch.setattr(FusedMoE, "forward_impl",
                        lambda self, *a, **kw: upstream_calls.append(1) or real_impl(self, *a, **kw))
    for rows, entry in entries.items():
        assert all(getattr(s, "lean", False) for s in entry.graph.steps) and len(entry.graph.steps) == 2
        static_x.copy_(torch.randn(12, 32).to(torch.bfloat16))
        entry.graph.replay()
        assert not upstream_calls  # replay never entered upstream's chain
        assert torch.equal(entry.output, _eager(model, static_x[:rows].clone()))
        upstream_calls.clear()


def test_mismatch_keeps_upstreams_path_for_that_size(kernels, monkeypatch, caplog):
    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    lean = LeanMoe("cpu")
    real_calls = lean_moe.launch_calls

    def off_by_one(plan, layer, h, tw, ti, out):
        return real_calls(plan, layer, h, tw, ti, out) + ((lambda: out.add_(1)),)

    monkeypatch.setattr(lean_moe, "launch_calls", off_by_one)
    with caplog.at_level(logging.WARNING, logger=lean_moe.__name__):
        bad = _capture(model, static_x, 12, lean)
    assert any("differs from upstream's at size 12" in r.getMessage() for r in caplog.records)
    assert not any(getattr(s, "lean", False) for s in bad.graph.steps)
    monkeypatch.setattr(lean_moe, "launch_calls", real_calls)
    good = _capture(model, static_x, 5, lean)
    assert all(getattr(s, "lean", False) for s in good.graph.steps)
    static_x.copy_(torch.randn(12, 32).to(torch.bfloat16))
    for rows, entry in ((12, bad), (5, good)):
        entry.graph.replay()
        assert torch.equal(entry.output, _eager(model, static_x[:rows].clone()))


def test_without_lean_the_boundary_is_unchanged(kernels):
    model = ToyMoeModel()
    static_x = torch.randn(6, 32).to(torch.bfloat16)
    entry = _capture(model, static_x, 6, None)
    assert not any(getattr(s, "lean", False) for s in entry.graph.steps)
    entry.graph.replay()
    assert torch.equal(entry.output, _eager(model, static_x.clone()))


# ------------------------------------------------------------------------------------------------
# prefill: lean steps up to a token cap
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, want", [(None, lean_moe.DEFAULT_PREFILL_CAP), ("", lean_moe.DEFAULT_PREFILL_CAP),
                                       ("0", 0), ("1024", 1024), (" 2048 ", 2048)])
def test_prefill_cap_from_the_environment(env_value, raw, want):
    env_value(lean_moe.PREFILL_CAP_ENV, raw)
    assert lean_moe.lean_prefill_cap() == want


@pytest.mark.parametrize("raw", ["-1", "4k", "1e3"])
def test_a_bad_prefill_cap_is_an_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(lean_moe.PREFILL_CAP_ENV, raw)
    with pytest.raises(ValueError, match=lean_moe.PREFILL_CAP_ENV):
        lean_moe.lean_prefill_cap()


def test_rows_above_the_cap_keep_upstreams_path(kernels, caplog):
    layer = make_layer(topk=2)
    lean = LeanMoe("cpu", max_rows=8)
    with caplog.at_level(logging.INFO, logger=lean_moe.__name__):
        assert lean.bind(layer, make_inputs(layer, 9), {}) is None
        assert lean.bind(layer, make_inputs(layer, 8), {}) is not None
    assert [r.getMessage() for r in caplog.records] == [
        f"lean eager MoE: 9 rows, above the lean cap of 8 ({lean_moe.PREFILL_CAP_ENV}); upstream's MoE path runs there"]
    assert lean.summary()["max_rows"] == 8 and lean.summary()["plans"] == 1


def test_capped_capture_is_lean_only_at_or_below_the_cap(kernels):
    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    lean = LeanMoe("cpu", max_rows=8)
    entries = {rows: _capture(model, static_x, rows, lean) for rows in (12, 8, 5)}  # largest first
    for rows, entry in entries.items():
        assert [getattr(s, "lean", False) for s in entry.graph.steps] == [rows <= 8] * 2
        static_x.copy_(torch.randn(12, 32).to(torch.bfloat16))
        entry.graph.replay()
        assert torch.equal(entry.output, _eager(model, static_x[:rows].clone()))


def _prefill_backend(monkeypatch, env):
    pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")
    from types import SimpleNamespace

    from sglang.sm120.runner.backend import LayerwisePrefillBackend
    from test_runner_backend import FakeDeviceModule, FakeTP

    for k in (lean_moe.ENV, lean_moe.PREFILL_CAP_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    runner = SimpleNamespace(device_module=FakeDeviceModule(), model_runner=SimpleNamespace(tp_group=FakeTP()),
                             capture_num_tokens=[128, 1024, 8192], device="cpu")
    with get_parallel().override(tp_group=FakeTP()):  # where 0.5.23's backends take it
        return LayerwisePrefillBackend(runner)


@pytest.mark.parametrize("env, want", [
    ({}, lean_moe.DEFAULT_PREFILL_CAP),                                  # on by default
    ({lean_moe.ENV: "0"}, None),                                         # turned off
    ({lean_moe.ENV: "1"}, lean_moe.DEFAULT_PREFILL_CAP),
    ({lean_moe.ENV: "1", lean_moe.PREFILL_CAP_ENV: "1024"}, 1024),
    ({lean_moe.ENV: "1", lean_moe.PREFILL_CAP_ENV: "0"}, None),          # lean decode, prefill off
])
def test_prefill_backend_takes_lean_steps_up_to_the_cap(monkeypatch, env, want):
    backend = _prefill_backend(monkeypatch, env)
    assert (None if backend.lean is None else backend.lean.max_rows) == want


def test_prefill_backend_refuses_a_bad_cap(monkeypatch):
    with pytest.raises(ValueError, match=lean_moe.PREFILL_CAP_ENV):
        _prefill_backend(monkeypatch, {lean_moe.ENV: "1", lean_moe.PREFILL_CAP_ENV: "lots"})


class _NoGraph:
    """A graph that records nothing (the CPU emulator keeps every tensor it taped)."""

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        pass

    def replay(self):
        pass


@pytest.mark.parametrize("lean_on, zero_copy", [(True, False), (False, False), (True, True)],
                         ids=["lean", "upstream", "lean-zero-copy"])
def test_tensors_crossing_a_cut_die_with_the_model_s_references(kernels, monkeypatch, lean_on, zero_copy):
    """With the garbage collector off, as between its runs on the GPU: nothing of the boundary keeps
    a captured MoE input alive (on the H200 a reference cycle once kept one hidden-state-sized
    block per layer in the graph pool)."""
    import gc
    import weakref

    from sglang.sm120.runner import boundary

    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    seen = []
    real = boundary.CaptureSession.on_boundary

    def spy(self, owner, args, kwargs):
        seen.extend(weakref.ref(t) for t in boundary.flatten((args, kwargs))[0])
        return real(self, owner, args, kwargs)

    monkeypatch.setattr(boundary.CaptureSession, "on_boundary", spy)
    gc.collect()
    gc.disable()
    try:
        with torch.no_grad():
            entry = capture_size(lambda: model(static_x[:12]), arena=StagingArena(12, "cpu"), warmups=1,
                                 graph_factory=_NoGraph, lean=LeanMoe("cpu") if lean_on else None,
                                 zero_copy=zero_copy)
        assert len(seen) == 8 and len(entry.graph.steps) == 2
        assert [getattr(st, "zero_copy", False) for st in entry.graph.steps] == [zero_copy] * 2
        assert [r() for r in seen if r() is not None] == []
    finally:
        gc.enable()


def test_a_lean_step_that_raises_keeps_upstreams_path_for_that_size(kernels, monkeypatch, caplog):
    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    real_calls = lean_moe.launch_calls

    def broken(plan, layer, h, tw, ti, out):
        def boom():
            raise TypeError("run_activation() takes 3 arguments")  # e.g. an upstream signature change
        return real_calls(plan, layer, h, tw, ti, out) + (boom,)

    monkeypatch.setattr(lean_moe, "launch_calls", broken)
    with caplog.at_level(logging.WARNING, logger=lean_moe.__name__):
        entry = _capture(model, static_x, 12, LeanMoe("cpu"))
    assert any("the lean step raised TypeError" in r.getMessage() for r in caplog.records)
    assert not any(getattr(s, "lean", False) for s in entry.graph.steps)
    static_x.copy_(torch.randn(12, 32).to(torch.bfloat16))
    entry.graph.replay()
    assert torch.equal(entry.output, _eager(model, static_x.clone()))


def test_the_jit_activation_is_called_without_the_custom_op(kernels, monkeypatch):
    """Where upstream's entry point is its CUDA JIT activation's (0.5.16: sglang.jit_kernel.activation,
    0.5.23: sglang.kernels.ops.activation.activation), the step calls its JIT module's run_activation
    with the views and name upstream's custom op passes; a row-filtered call is upstream's own."""
    act_name, module_fn = next((m, f) for m, f in lean_moe._JIT_ACTIVATION if upstream_api.has(m))
    jit_act = upstream_api.require(act_name)
    module_of = module_fn.rsplit(".", 1)[1]  # the function's name in that module
    calls = []

    class Module:
        def run_activation(self, x2d, out2d, name):
            calls.append((x2d.shape, out2d.shape, name, x2d.data_ptr(), out2d.data_ptr()))

    monkeypatch.setattr(jit_act, module_of, lambda dtype: Module())
    x, out = torch.zeros(6, 2, 16), torch.zeros(6, 2, 8)
    lean_moe._activation_call(jit_act.silu_and_mul, "silu", x.view(-1, 16), out)()
    assert calls == [((12, 16), (12, 8), "silu", x.data_ptr(), out.data_ptr())]
    stand_in = []
    lean_moe._activation_call(lambda a, b: stand_in.append((a, b)), "silu", x, out)()
    assert len(stand_in) == 1 and len(calls) == 1  # another entry point: called as it is
    filtered = lean_moe._activation_call(jit_act.silu_and_mul, "silu", x.view(-1, 16), out, expert_step=4)
    assert filtered.func is jit_act.silu_and_mul and filtered.keywords == {"expert_step": 4}


# ------------------------------------------------------------------------------------------------
# zero-copy inputs (SGLANG_SM120_LAYERWISE_ZERO_COPY): lean steps read the segment's own tensors
# ------------------------------------------------------------------------------------------------
def _copies_into(entry, arena):
    """aten.copy_ ops the captured segments issue into the arena's staged-input buffers."""
    staged = {b.untyped_storage().data_ptr() for (name, *_), b in arena._buffers.items() if name.startswith("in.")}
    return sum(1 for seg in entry.graph.segments for func, args, _, _ in seg._tape
               if func.overloadpacket is torch.ops.aten.copy_ and args[0].untyped_storage().data_ptr() in staged)


@pytest.mark.parametrize("lean_on", [True, False], ids=["lean", "upstream"])
def test_zero_copy_lean_steps_read_the_segments_tensors_and_replay_equals_eager(kernels, lean_on):
    model = ToyMoeModel()
    static_x = torch.randn(12, 32).to(torch.bfloat16)
    runs = {}
    for zero_copy in (False, True):
        arena = StagingArena(12, "cpu")
        with torch.no_grad():
            entry = capture_size(lambda: model(static_x[:7]), arena=arena, warmups=1, graph_factory=RecordingGraph,
                                 lean=LeanMoe("cpu") if lean_on else None, zero_copy=zero_copy)
        runs[zero_copy] = (entry, arena)
    for zero_copy, (entry, arena) in runs.items():
        in_place = zero_copy and lean_on  # upstream's forward may write its inputs: it keeps the copies
        assert [getattr(st, "zero_copy", False) for st in entry.graph.steps] == [in_place] * 2
        # four token-major inputs per island (hidden states, top-k weights, ids, router logits), two islands
        assert _copies_into(entry, arena) == (0 if in_place else 8)
    for _ in range(2):
        static_x.copy_(torch.randn(12, 32).to(torch.bfloat16))
        want = _eager(model, static_x[:7].clone())
        for entry, _ in runs.values():
            entry.graph.replay()
            assert torch.equal(entry.output, want)


def test_non_owning_view_aliases_without_keeping_the_memory_alive():
    import weakref

    from sglang.sm120.runner.zero_copy import non_owning_view

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    t = base[1:, ::2]  # offset and strides
    v = non_owning_view(t)
    assert v.shape == t.shape and v.stride() == t.stride() and v.data_ptr() == t.data_ptr()
    base[3, 4] = -1.0
    assert torch.equal(v, t) and v[2, 2].item() == -1.0
    ref = weakref.ref(base)
    del base, t
    assert ref() is None  # the view did not keep it
    assert non_owning_view(torch.empty(0, 5)).shape == (0, 5)


@pytest.mark.parametrize("raw, want", [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_zero_copy_switch_from_the_environment(env_value, raw, want):
    from sglang.sm120.runner import zero_copy

    env_value(zero_copy.ENV, raw)
    assert zero_copy.requested() is want


def test_a_bad_zero_copy_switch_names_the_variable(monkeypatch):
    from sglang.sm120.runner import config, zero_copy

    monkeypatch.setenv(zero_copy.ENV, "yes")
    with pytest.raises(ValueError, match=f"{zero_copy.ENV}='yes': expected 1"):
        zero_copy.requested()
    assert "zero_copy.requested()" in inspect.getsource(config.finalize)  # checked at ServerArgs time
