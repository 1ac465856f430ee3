"""Lean eager MoE step for the layerwise runner: upstream's Triton MoE kernels, launched directly.

Between two graph segments the MoE runs eagerly on every layer of every step, and upstream's
path spends most of its host time outside the kernels (docs/runner.md, "Lean eager MoE"): the dispatcher /
quant-method / runner chain, the `torch.ops.sglang` custom op, a config lookup and seven
`torch.empty` per call, and a copy from the staging buffer to the layer's output. Here, once per
(layer shape, batch size), the same config is looked up through upstream's own function, and
the intermediate buffers are views into one workspace shared by every layer and size (one
layer runs at a time, on one stream); at each step the same kernels run with the same arguments
(Triton's launches resolved once, triton_launch.py; the activation's JIT function called without
its torch custom-op wrapper), and the combine writes straight into the boundary's output buffer.

Only the unquantized Triton path is taken, and only where it is the path upstream would take
(`refusal` says why not, logged once per reason), on bases 0.5.16 and 0.5.23 (what 0.5.23 decides
differently, and refuses besides: lean_triton_0523.py). A ModelOpt NVFP4 layer on the sm120 MoE backend
(`--moe-runner-backend sm120`, fp4_moe) gets its own step on either base: the grouped kernel
called directly, as upstream's path calls it (fp4_moe.run), with scratch shared by every layer. On by default (its results equal upstream's
path bit for bit, docs/runner.md, "Lean eager MoE"); SGLANG_SM120_LEAN_MOE=0 turns it off. For decode and for
the captured-attention prefill buckets up to SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS (default 4096):
the workspace grows with the rows (intermediate activations of every row at the largest bucket).
The boundary (ProbeSession) runs both paths on the warmup inputs of every size and keeps this
one only where the results are torch.equal.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .. import settings
from . import lean_triton_0523
from .triton_launch import ResolvedOnce

logger = logging.getLogger(__name__)

ENV = "SGLANG_SM120_LEAN_MOE"
PREFILL_CAP_ENV = "SGLANG_SM120_LEAN_MOE_PREFILL_TOKENS"
DEFAULT_PREFILL_CAP = settings.setting(PREFILL_CAP_ENV).default


def lean_moe_requested() -> bool:
    """SGLANG_SM120_LEAN_MOE: unset or 1 = on (the default), 0 = upstream's MoE path everywhere."""
    return settings.switch(ENV)


def lean_prefill_cap() -> int:
    """Largest prefill bucket (tokens) given lean steps; 0 turns lean prefill off."""
    return settings.integer(PREFILL_CAP_ENV)


def _upstream():
    """Upstream's modules whose attributes are the kernel entry points both paths call (looked
    up at bind time, so a test's stand-ins are seen by both)."""
    import importlib

    # importlib: the package re-exports a function under the align module's own name.
    fm = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe")
    mab = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")
    return fm, mab


def _down_tma_supported() -> bool:
    """Upstream's own answer to "may the down projection use TMA" (named per base)."""
    from sglang.sm120 import upstream_api

    name = "fused_moe._down_moe_use_tma" if upstream_api.has("fused_moe._down_moe_use_tma") \
        else "fused_moe._moe_support_tma"
    return bool(upstream_api.require(name)())


# ------------------------------------------------------------------------------------------------
# gate
# ------------------------------------------------------------------------------------------------
# The upstream bases whose Triton MoE launches the lean step reproduces argument for argument
# (0.5.23's own decisions: lean_triton_0523.py); on any other base every layer keeps upstream's
# path (the gate says so once per layer).
LEAN_STEP_BASES = ("0.5.16", "0.5.23")


def _on_0523() -> bool:
    from sglang.sm120 import upstream_api

    return upstream_api.check_installed() == "0.5.23"


def _dispatch_refusal(layer) -> Optional[str]:
    """Why the layer's forward does more around its experts than a lean step does: another
    dispatcher, expert parallelism, or its own all-reduce; None when it does not."""
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatcher

    if type(layer.dispatcher) is not StandardDispatcher:
        return f"dispatcher {type(layer.dispatcher).__name__}"
    if layer.moe_ep_size != 1 or layer.dispatcher.local_expert_mapping is not None:
        return "expert parallelism"
    if layer.reduce_results and layer.moe_tp_size > 1:
        return "the layer all-reduces its own output (reduce_results with TP > 1)"
    return None


def layer_refusal(layer) -> Optional[str]:
    """Why `layer.forward` would not take the plain Triton path the lean step reproduces (or, for
    a layer on the sm120 MoE backend, the kernel call the sm120 step makes); None when it would."""
    from sglang.sm120 import fp4_moe, upstream_api

    if fp4_moe.uses_kernel(layer):
        return sm120_layer_refusal(layer)
    base = upstream_api.check_installed()
    if base not in LEAN_STEP_BASES:
        return f"the lean step is not ported to upstream sglang {base} (it reproduces {', '.join(LEAN_STEP_BASES)})"
    from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.moe_runner.triton import fused_experts_none_to_triton
    from sglang.srt.layers.moe.moe_runner.triton_utils import get_config
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    fm, mab = _upstream()
    if type(layer) is not FusedMoE:
        return f"{type(layer).__name__} is not FusedMoE itself"
    qm = layer.quant_method
    if type(qm) is not UnquantizedFusedMoEMethod:
        return f"quant method {type(qm).__name__} (only unquantized bf16/fp16 experts)"
    method = lean_triton_0523.forward_method(qm) if base == "0.5.23" else getattr(qm, "_forward_method", None)
    if getattr(method, "__func__", None) is not UnquantizedFusedMoEMethod.forward_cuda:
        return "the quant method does not dispatch to forward_cuda (not CUDA, or torch.compile)"
    runner = getattr(qm, "runner", None)
    if runner is None or not runner.runner_backend.is_triton():
        return f"MoE runner backend {getattr(runner, 'runner_backend', None)} (only triton)"
    if getattr(qm, "_aiter_runner", None) is not None:
        return "aiter runner"
    if runner.lora_enabled or runner.fused_func is not fused_experts_none_to_triton:
        return "LoRA, an all-to-all backend or SGLANG_CI_DISABLE_MOE_FUSED_FUNC (not the fused triton func)"
    if getattr(layer, "_use_ascend_fuseep", False) or not fm._is_cuda:
        return "not CUDA"
    why = _dispatch_refusal(layer)
    if why is not None:
        return why
    if getattr(layer, "w13_weight_bias", None) is not None or getattr(layer, "w2_weight_bias", None) is not None:
        return "expert bias"
    cfg = layer.moe_runner_config
    if cfg.num_experts is None or cfg.num_experts != cfg.num_local_experts:
        return "expert filtering (num_experts != num_local_experts)"
    if cfg.activation not in ("silu", "gelu") or not cfg.is_gated:
        return f"activation {cfg.activation!r} gated={cfg.is_gated} (only gated silu / gelu)"
    if cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None or cfg.swiglu_limit is not None:
        return "clamped / alpha SwiGLU"
    if cfg.no_combine:
        return "no_combine"
    if cfg.top_k == 1 and cfg.routed_scaling_factor not in (None, 1.0):
        return "top_k 1 with a routed scaling factor"
    if upstream_api.resolved("enable_deterministic_inference") or is_batch_invariant_mode_enabled():
        return "deterministic inference (batch-invariant mode)"
    if upstream_api.resolved("enable_fused_moe_sum_all_reduce"):
        return "--enable-fused-moe-sum-all-reduce"
    if mab._SGLANG_EXPERIMENTAL_LORA_OPTI:
        return "SGLANG_EXPERIMENTAL_LORA_OPTI (another align kernel)"
    if get_config() is not None:
        return "an override_config() MoE config is active"
    return lean_triton_0523.layer_refusal(layer) if base == "0.5.23" else None


def sm120_layer_refusal(layer) -> Optional[str]:
    """Why `forward` of a layer on the sm120 MoE backend does more than the kernel call
    (upstream's forward_impl: dispatch, quant_method.apply = fp4_moe.apply, combine); None when
    it does not."""
    from sglang.srt.layers.moe import utils as moe_utils
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    if type(layer) is not FusedMoE:
        return f"{type(layer).__name__} is not FusedMoE itself"
    if getattr(layer, "_use_ascend_fuseep", False):
        return "not CUDA"
    if getattr(layer, "_dwdp_bound", False):
        return "DWDP weight prefetch around the layer"
    why = _dispatch_refusal(layer)
    if why is not None:
        return why
    if moe_utils.should_use_flashinfer_cutlass_moe_fp4_allgather():
        return "the FlashInfer FP4 all-gather dispatch"
    return None


def call_refusal(layer, hidden_states, topk_output) -> Optional[str]:
    """Why this call's tensors are outside what the lean step handles; None when they are not."""
    from sglang.sm120 import fp4_moe
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    if type(topk_output) is not StandardTopKOutput:
        return f"top-k output {type(topk_output).__name__} (only StandardTopKOutput)"
    if fp4_moe.uses_kernel(layer):
        return sm120_call_refusal(layer, hidden_states, topk_output)
    if hidden_states.dtype not in (torch.bfloat16, torch.float16):
        return f"hidden states {hidden_states.dtype} (only bf16 / fp16)"
    if hidden_states.dim() != 2 or not hidden_states.is_contiguous() or hidden_states.shape[0] < 1:
        return "hidden states not a non-empty contiguous 2-D tensor"
    w1, w2 = layer.w13_weight, layer.w2_weight
    if not (w1.is_contiguous() and w2.is_contiguous()):
        return "expert weights not contiguous"
    if not hidden_states.shape[1] == w1.shape[2] == w2.shape[1]:
        return "hidden size differs from the expert weights' (padded hidden size)"
    tw, ti = topk_output.topk_weights, topk_output.topk_ids
    if tw.shape != ti.shape or tw.dim() != 2 or tw.shape[0] != hidden_states.shape[0] or tw.stride(1) != 1:
        return "top-k weights / ids of an unexpected shape"
    return None


def sm120_call_refusal(layer, hidden_states, topk_output) -> Optional[str]:
    """Why the grouped kernel would refuse (or reshape) this call; None when it takes it as is."""
    if hidden_states.dtype != torch.bfloat16:
        return f"hidden states {hidden_states.dtype} (the grouped kernel takes bf16)"
    if hidden_states.dim() != 2 or not hidden_states.is_contiguous() or hidden_states.shape[0] < 1:
        return "hidden states not a non-empty contiguous 2-D tensor"
    if hidden_states.shape[1] != layer.sm120_experts.hidden:
        return "hidden size differs from the experts' (padded hidden size)"
    tw, ti = topk_output.topk_weights, topk_output.topk_ids
    if tw.shape != ti.shape or tw.dim() != 2 or tw.shape[0] != hidden_states.shape[0]:
        return "top-k weights / ids of an unexpected shape"
    if tw.dtype != torch.float32 or ti.dtype not in (torch.int32, torch.int64):
        return f"top-k weights {tw.dtype} / ids {ti.dtype} (the kernel takes fp32 / int32 or int64)"
    return None


def _moe_call_args(args, kwargs) -> Optional[Tuple[Any, Any]]:
    """(hidden_states, topk_output) of a `FusedMoE.forward(hidden_states, topk_output)` call."""
    names = ("hidden_states", "topk_output")
    if len(args) + len(kwargs) != 2 or set(kwargs) - set(names[len(args):]):
        return None
    bound = dict(zip(names, args), **kwargs)
    return bound["hidden_states"], bound["topk_output"]


# ------------------------------------------------------------------------------------------------
# per-size plan and the shared workspace
# ------------------------------------------------------------------------------------------------
class LeanWorkspace:
    """Flat buffers, one per (role, dtype), sized for the largest plan seen; plans take views of
    their leading elements. Sizes are captured largest first, so normally nothing grows."""

    def __init__(self, device) -> None:
        self.device = torch.device(device)
        self._flat: Dict[Tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, role: str, shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = 1
        for d in shape:
            numel *= d
        key = (role, dtype)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < numel:
            # A larger plan after a smaller one: earlier plans keep their (still valid) buffer.
            flat = torch.empty(numel, dtype=dtype, device=self.device)
            self._flat[key] = flat
        return flat[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._flat.values())


@dataclass
class LeanPlan:
    """What upstream's `_prepare_fused_moe_run` / `_fused_moe_kernel_sequence` decide for one
    (expert shapes, top-k, dtype, rows), decided once; buffers are workspace views of the
    lengths upstream allocates (kernel grids and Triton specializations depend on them)."""

    rows: int
    topk: int
    num_experts: int
    n: int
    config: Dict[str, Any]
    down_config: Optional[Dict[str, Any]]
    use_tma: bool  # the down GEMM's
    compute_type: Any
    reduce: str  # "none" | "add" | "sum_compiled_helper" | "sum_triton" | "sum_kernel"
    routed_scaling_factor: float
    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_pad: torch.Tensor
    cumsum: torch.Tensor
    cache1: torch.Tensor
    cache2: torch.Tensor
    cache3: Optional[torch.Tensor]
    up_kwargs: Dict[str, Any]  # what the base's up GEMM call adds to 0.5.16's
    small_align: bool = False  # 0.5.23's single-CTA align


def build_plan(workspace: LeanWorkspace, layer, hidden_states, topk_ids) -> LeanPlan:
    import triton.language as tl

    fm, mab = _upstream()
    w1, w2 = layer.w13_weight, layer.w2_weight
    cfg = layer.moe_runner_config
    rows, topk = hidden_states.shape[0], topk_ids.shape[1]
    E, N, _ = w1.shape
    config_dtype = fm.get_config_dtype_str(dtype=hidden_states.dtype)
    config, (down_config, _) = fm.try_get_optimal_moe_config(
        w1.shape, (w2.shape[0], w2.shape[1], w2.shape[2]), topk, config_dtype, rows,
        block_shape=None, per_channel_quant=False, return_down_config=True,
    )
    block_m = config["BLOCK_SIZE_M"]
    numel = rows * topk
    if numel < E + 1:
        max_padded = numel * block_m
    else:
        max_padded = numel + (E + 1) * (block_m - 1)
    on_0523 = _on_0523()
    up_kwargs, small_align = {}, False
    if on_0523:
        config, up_tma, use_tma = lean_triton_0523.tma_flags(fm, config, down_config)
        up_kwargs = dict(b_use_tma=up_tma, fuse_swiglu=False)
        max_padded, small_align = lean_triton_0523.align_plan(mab, max_padded, numel, E)
    else:
        use_tma = bool(_down_tma_supported() and down_config is not None and down_config.pop("USE_TMA", False))
    max_blocks = -(-max_padded // block_m)
    total = numel + (min(numel, E + 1) * (block_m - 1) if use_tma else 0)
    rsf = 1.0 if cfg.routed_scaling_factor is None else cfg.routed_scaling_factor
    if topk == 1:
        reduce = "none"  # the down kernel writes the output itself
    elif topk == 2 and rsf == 1.0:
        reduce = "add"
    elif fm._use_moe_sum_reduce_torch_compile(rows):
        reduce = lean_triton_0523.small_sum(fm) if on_0523 else "sum_compiled_helper"
    else:
        reduce = "sum_kernel"
    dt = hidden_states.dtype
    i32 = torch.int32
    return LeanPlan(
        rows=rows, topk=topk, num_experts=E, n=N, config=config, down_config=down_config,
        use_tma=use_tma,
        compute_type=tl.bfloat16 if dt == torch.bfloat16 else tl.float16,
        reduce=reduce, routed_scaling_factor=rsf,
        sorted_ids=workspace.take("sorted_token_ids", (max_padded,), i32),
        expert_ids=workspace.take("expert_ids", (max_blocks,), i32),
        num_tokens_post_pad=workspace.take("num_tokens_post_pad", (1,), i32),
        cumsum=workspace.take("cumsum", (E + 2,), i32),
        cache1=workspace.take("cache1", (total, N), dt),
        cache2=workspace.take("cache2", (total, N // 2), dt),
        cache3=None if topk == 1 else workspace.take("cache3", (rows, topk, w2.shape[1]), dt),
        up_kwargs=up_kwargs, small_align=small_align,
    )


# Per base, anchors of upstream's CUDA gated activations: their module, and its function giving
# the JIT module.
_JIT_ACTIVATION = (("jit_kernel.activation", "jit_kernel.activation._jit_activation_module"),  # 0.5.16
                   ("kernels.activation", "kernels.activation.activation_module"))             # 0.5.23


def _activation_call(entry, name: str, x: torch.Tensor, out: torch.Tensor, **row_filter) -> Callable[[], Any]:
    """The gated activation's launch. Upstream's CUDA entry point (0.5.16: sglang.jit_kernel.activation,
    0.5.23: sglang.kernels.ops.activation.activation) goes through a torch custom op to its JIT
    module's `run_activation(input_2d, out_2d, name)`; the step calls that module function with the
    same views and name, without the op dispatch (same kernel, same arguments). A row-filtered
    call (0.5.23, TMA down GEMM) takes other custom ops: it, and any other entry point (another
    platform's, a test's stand-in), is called as upstream calls it."""
    from sglang.sm120 import upstream_api

    found = next(((m, f) for m, f in _JIT_ACTIVATION if upstream_api.has(m)), None)
    if row_filter or found is None or entry is not getattr(upstream_api.require(found[0]), f"{name}_and_mul", None):
        return partial(entry, x, out, **row_filter)
    hidden = x.shape[-1] // 2
    module = upstream_api.require(found[1])(x.dtype)
    return partial(module.run_activation, x.view(-1, 2 * hidden), out.view(-1, hidden), name)


# The Triton kernels upstream's invoke_fused_moe_kernel launches on the unquantized path (and, on
# 0.5.23, its small-batch align and sum); the lean step resolves their launches once
# (triton_launch.py) instead of through Triton each call.
TRITON_KERNELS = ("fused_moe_kernel",)
SMALL_ALIGN_KERNELS = ("_moe_align_small_numel_kernel",)
SUM_KERNELS = ("_moe_sum_reduce_kernel",)


def launch_calls(plan: LeanPlan, layer, hidden_states, topk_weights, topk_ids, out) -> Tuple[Callable[[], Any], ...]:
    """The kernel launches of upstream's sequence for this plan, arguments bound: moe_align,
    gate/up GEMM, activation, down GEMM, combine into `out`."""
    from sglang.sm120 import upstream_api

    fm, mab = _upstream()
    w1, w2 = layer.w13_weight, layer.w2_weight
    cfg = layer.moe_runner_config
    on_input = cfg.apply_router_weight_on_input
    quant_off = dict(use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                     use_int4_w4a16=False, per_channel_quant=False, block_shape=None)
    routing = (topk_weights, topk_ids, plan.sorted_ids, plan.expert_ids, plan.num_tokens_post_pad)
    block_m = plan.config["BLOCK_SIZE_M"]
    align = (plan.num_experts + 1, block_m, plan.sorted_ids, plan.expert_ids, plan.num_tokens_post_pad)
    row_filter = {}
    if upstream_api.has("fused_moe._activation_row_filter"):
        row_filter = fm._activation_row_filter(
            down_moe_use_tma=plan.use_tma, filter_expert=False, topk_ids=topk_ids, expert_ids=plan.expert_ids,
            sorted_token_ids=plan.sorted_ids, num_tokens_post_padded=plan.num_tokens_post_pad, block_size_m=block_m)
    calls = [
        ResolvedOnce(partial(mab.moe_align_small_numel, topk_ids, *align, write_inactive_prefix_count=False),
                     SMALL_ALIGN_KERNELS) if plan.small_align else
        partial(mab.sgl_moe_align_block_size, topk_ids, *align, plan.cumsum, True, False),
        ResolvedOnce(partial(
            fm.invoke_fused_moe_kernel, hidden_states, w1, None, plan.cache1, None, None, None,
            *routing, on_input, plan.topk, plan.config, compute_type=plan.compute_type,
            **quant_off, c_sorted=plan.use_tma, **plan.up_kwargs, filter_expert=False), TRITON_KERNELS),
        _activation_call(fm.silu_and_mul if cfg.activation == "silu" else fm.gelu_and_mul,
                         cfg.activation, plan.cache1.view(-1, plan.n), plan.cache2, **row_filter),
        ResolvedOnce(partial(
            fm.invoke_fused_moe_kernel, plan.cache2, w2, None,
            out.unsqueeze(0) if plan.cache3 is None else plan.cache3, None, None, None,
            *routing, not on_input, 1, plan.down_config or plan.config,
            compute_type=plan.compute_type, **quant_off, a_use_tma=plan.use_tma,
            b_use_tma=plan.use_tma, filter_expert=False, fuse_sum_all_reduce=False,
            router_topk=plan.topk), TRITON_KERNELS),
    ]
    c3 = plan.cache3
    if plan.reduce == "add":
        calls.append(partial(torch.add, c3[:, 0], c3[:, 1], out=out))
    elif plan.reduce == "sum_compiled_helper" and plan.routed_scaling_factor == 1.0:
        # the helper's out.mul_(1.0) leaves every bit as it is: one launch fewer per step
        calls.append(partial(torch.sum, c3, dim=1, out=out))
    elif plan.reduce == "sum_compiled_helper":
        calls.append(partial(fm.moe_sum_reduce_torch_compile, c3, out, plan.routed_scaling_factor))
    elif plan.reduce == "sum_triton":
        calls.append(ResolvedOnce(partial(fm.moe_sum_reduce_triton, c3, out, plan.routed_scaling_factor),
                                  SUM_KERNELS))
    elif plan.reduce == "sum_kernel":
        calls.append(partial(fm.moe_sum_reduce, c3, out, plan.routed_scaling_factor))
    return tuple(calls)


# ------------------------------------------------------------------------------------------------
# what the boundary uses
# ------------------------------------------------------------------------------------------------
class LeanMoe:
    """Plans and workspace of one capture backend; `bind` makes the eager step of one island."""

    def __init__(self, device, max_rows: Optional[int] = None) -> None:
        self.max_rows = max_rows  # larger calls keep upstream's path (the workspace grows with rows)
        self.workspace = LeanWorkspace(device)
        self._plans: Dict[tuple, LeanPlan] = {}
        # layer_refusal per layer: what it reads is fixed once weights are loaded, and bind runs
        # for every layer at every captured size, twice (probe and capture).
        self._layer_refusals: Dict[int, Optional[str]] = {}
        self._logged: set = set()
        self.refusals: Dict[str, int] = {}
        self.moe_scratch = None  # the sm120 steps' kernels.MoeScratch, made at the first one

    def _refuse(self, why: str) -> None:
        self.refusals[why] = self.refusals.get(why, 0) + 1
        if why not in self._logged:
            self._logged.add(why)
            logger.info("lean eager MoE: %s; upstream's MoE path runs there", why)

    def note_mismatch(self, size: int, island: int, detail: str) -> None:
        logger.warning(
            "lean eager MoE: result differs from upstream's at size %d, eager island #%d (%s); "
            "size %d uses upstream's MoE path", size, island, detail, size,
        )

    def bind(self, owner, args, kwargs, out: Optional[torch.Tensor] = None):
        """(step, out): a zero-argument function running owner's MoE on these tensors into
        `out` (allocated when None), or None when the lean path does not apply (logged)."""
        call = _moe_call_args(args, kwargs)
        if call is None:
            self._refuse("a FusedMoE.forward call with other arguments")
            return None
        hidden_states, topk_output = call
        if id(owner) not in self._layer_refusals:
            self._layer_refusals[id(owner)] = layer_refusal(owner)
        why = self._layer_refusals[id(owner)] or call_refusal(owner, hidden_states, topk_output)
        if why is None and self.max_rows is not None and hidden_states.shape[0] > self.max_rows:
            why = f"{hidden_states.shape[0]} rows, above the lean cap of {self.max_rows} ({PREFILL_CAP_ENV})"
        if why is not None:
            self._refuse(why)
            return None
        from sglang.sm120 import fp4_moe

        if fp4_moe.uses_kernel(owner):
            return self._bind_sm120(owner, hidden_states, topk_output, out)
        w1, w2 = owner.w13_weight, owner.w2_weight
        tw, ti = topk_output.topk_weights, topk_output.topk_ids
        key = (tuple(w1.shape), tuple(w2.shape), tuple(ti.shape), hidden_states.dtype,
               str(hidden_states.device), owner.moe_runner_config.routed_scaling_factor)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build_plan(self.workspace, owner, hidden_states, ti)
        if out is None:
            out = torch.empty((hidden_states.shape[0], w2.shape[1]), dtype=hidden_states.dtype,
                              device=hidden_states.device)
        return _make_lean_step(plan, owner, hidden_states, tw, ti, out), out

    def _bind_sm120(self, owner, hidden_states, topk_output, out):
        from sglang.sm120 import kernels

        if self.moe_scratch is None:
            self.moe_scratch = kernels.MoeScratch(self.workspace.device)
        if out is None:
            out = torch.empty((hidden_states.shape[0], owner.sm120_experts.hidden), dtype=torch.bfloat16,
                              device=hidden_states.device)
        return _make_sm120_step(owner, hidden_states, topk_output, out, self.moe_scratch), out

    def summary(self) -> Dict[str, Any]:
        scratch = 0 if self.moe_scratch is None else self.moe_scratch.nbytes
        return {"plans": len(self._plans), "workspace_bytes": self.workspace.nbytes + scratch,
                "max_rows": self.max_rows, "refusals": dict(self.refusals)}


def _make_sm120_step(owner, hidden_states, topk_output, out, scratch):
    """The step of a layer on the sm120 MoE backend: fp4_moe.run, the call fp4_moe.apply makes on
    upstream's path, with `out` (the boundary's buffer) and the shared scratch. The packed experts
    are read from the layer at every call, so a rebound layer needs nothing."""
    from sglang.sm120 import fp4_moe

    def step() -> None:
        fp4_moe.run(owner, hidden_states, topk_output, out=out, scratch=scratch)

    def scrub() -> None:
        """NaN into `out` and the scratch's float buffers (see _make_lean_step)."""
        out.fill_(float("nan"))
        scratch.scrub()

    step.owner_name = f"{type(owner).__name__}(lean sm120)"
    step.lean = True
    step.sm120 = True
    step.scrub = scrub
    step.triton_resolved = lambda: []  # no Triton launches
    return step


def _make_lean_step(plan, owner, hidden_states, tw, ti, out):
    bound = [owner.w13_weight, owner.w2_weight]
    calls = launch_calls(plan, owner, hidden_states, tw, ti, out)

    def step() -> None:
        nonlocal calls
        # Weights rebound after capture (copy_or_rebind_param) must be read again, as upstream's
        # forward would; in-place weight updates need nothing.
        if owner.w13_weight is not bound[0] or owner.w2_weight is not bound[1]:
            bound[:] = [owner.w13_weight, owner.w2_weight]
            calls = launch_calls(plan, owner, hidden_states, tw, ti, out)
        for c in calls:
            c()

    def scrub() -> None:
        """NaN into the buffers the step writes (intermediates and `out`): a launch that does not
        run on the next call shows in its result. The probe calls it between its two calls."""
        for t in (plan.cache1, plan.cache2, plan.cache3, out):
            if t is not None:
                t.fill_(float("nan"))

    def triton_resolved() -> list:
        """Per Triton call of the step: whether its launches are resolved (after its first run)."""
        return [c.launches is not None for c in calls if isinstance(c, ResolvedOnce)]

    step.owner_name = f"{type(owner).__name__}(lean)"
    step.lean = True
    step.scrub = scrub
    step.triton_resolved = triton_resolved
    return step
