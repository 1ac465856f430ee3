"""Server-args side of the `layerwise` backend.

`finalize(server_args)` runs once upstream has resolved everything else (flags, JSON, legacy
aliases, the memory-derived sizes and backends): at the end of ServerArgs.__post_init__ on 0.5.16
(patch 0102, through hooks.finalize_server_args), after the last step of the resolution pipeline
on 0.5.23 (resolution_hook). It
  - falls back to upstream's backend for a phase whose configuration layerwise does not support
    (with one warning naming the feature), so a server never fails to start over it;
  - plans the captured sizes (sizes.py) and writes them into cuda_graph_config;
  - gives the legacy piecewise flags their layerwise meaning (tokens / max tokens = prefill
    buckets; the compiler flag is ignored with a warning);
  - turns on the Dynamo-free helpers (env var, inherited by the scheduler processes);
  - grows FlashInfer's workspace when decode is captured above the size it was sized for.

Reads server_args by attribute only, so tests can pass a SimpleNamespace.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional

from . import decode_attention, prefill_attention, zero_copy
from .lean_moe import lean_moe_requested, lean_prefill_cap
from .sizes import (
    LAYERWISE_DECODE_MAX_BS,
    DecodePlan,
    PrefillPlan,
    default_prefill_req_slots,
    plan_decode,
    plan_prefill,
)

logger = logging.getLogger(__name__)

LAYERWISE = "layerwise"
DECODE, PREFILL = "decode", "prefill"
DYNAMO_FREE_ENV = "SGLANG_SM120_DYNAMO_FREE"
FLASHINFER_WORKSPACE_ENV = "SGLANG_FLASHINFER_WORKSPACE_SIZE"
FLASHINFER_DEFAULT_WORKSPACE = 384 * 1024 * 1024


@dataclass
class Resolution:
    decode: Optional[DecodePlan]
    prefill: Optional[PrefillPlan]
    fallbacks: dict  # phase -> reason
    ceiling_rule: Optional[str] = None  # what set the decode full-graph ceiling


def _decode_sizes(sa, dec, locked, max_running):
    """(full-graph ceiling, largest captured batch, the rule that set the ceiling) of layerwise
    decode, from what upstream resolved for this card and these flags.

    The ceiling is the largest batch upstream itself would capture as a full graph: its decode max
    batch size, which it derives from the card's memory and TP and lowers to
    --max-running-requests (handle_gpu_memory_settings). An operator's --cuda-graph-max-bs-decode
    (or batch-size list) is the largest captured batch instead, as upstream takes it; the ceiling
    is then upstream's own default for the card (what it picks when none is given), below that
    top. Above the ceiling, layerwise sizes reach LAYERWISE_DECODE_MAX_BS. Like upstream, which
    never captures more batches than the request pool holds, --max-running-requests caps the top.
    """
    operator_top = ((DECODE, "max_bs") in locked and dec.max_bs) or ((DECODE, "bs") in locked and dec.bs)
    if operator_top:
        top = int(dec.max_bs or max(dec.bs))
        default = int(_call_upstream(sa, "upstream_default_decode_max_bs"))
        ceiling, rule = min(top, default), (
            f"upstream's default decode max batch for this card and flags ({default}), below the "
            f"operator's --cuda-graph-max-bs-decode / --cuda-graph-bs-decode ({top})")
    else:
        top = LAYERWISE_DECODE_MAX_BS
        ceiling = int(dec.max_bs)
        rule = f"upstream's decode max batch for this card and flags ({ceiling})"
    explicit_ceiling = getattr(dec, "layerwise_full_max_bs", None)
    if explicit_ceiling:
        ceiling, rule = int(explicit_ceiling), f"cuda_graph_config decode layerwise_full_max_bs ({explicit_ceiling})"
    if max_running:
        top = min(top, int(max_running))
        if ceiling > top:
            ceiling, rule = top, f"--max-running-requests ({top})"
    return max(1, ceiling), top, rule


def _call_upstream(sa, name):
    """A value only upstream's own resolution can give (resolution_hook.ResolvingArgs on 0.5.23,
    hooks.InPlaceArgs on 0.5.16). Errors propagate: a made-up default would size graphs wrongly."""
    fn = getattr(sa, name, None)
    if fn is None:
        raise AttributeError(f"{type(sa).__name__} has no {name}(), which the layerwise sizing needs")
    return fn()


def select_layerwise_for_unset_phases(namespace) -> List[str]:
    """What `--enable-piecewise-cuda-graph` does: layerwise for every phase whose backend was not
    chosen explicitly (so `--disable-piecewise-cuda-graph` or `--cuda-graph-backend-*` win in any
    order). Returns the phases it set."""
    chosen = []
    for phase in (DECODE, PREFILL):
        attr = f"cuda_graph_backend_{phase}"
        if getattr(namespace, attr, None) is None:
            setattr(namespace, attr, LAYERWISE)
            chosen.append(phase)
    return chosen


def _get(sa, name, default=None):
    """A ServerArgs attribute. The upstream fields read here are declared in upstream_api
    (SERVER_ARGS_FIELDS, checked on every base), so a missing one is an error, never `default`;
    `default` stands in for the attributes upstream_api.OPTIONAL_ATTRS names, and when a property
    raises on a partial ServerArgs."""
    from sglang.sm120 import upstream_api

    if name not in upstream_api.SERVER_ARGS_FIELDS and name not in upstream_api.OPTIONAL_ATTRS:
        raise KeyError(f"ServerArgs.{name}: not declared in sglang/sm120/upstream_api.py")
    try:
        return getattr(sa, name)
    except AttributeError:
        if name in upstream_api.SERVER_ARGS_FIELDS:
            raise AttributeError(f"{type(sa).__name__} has no field {name}, which upstream_api declares "
                                 "for every base") from None
        return default
    except Exception:  # noqa: BLE001 - properties on a partial ServerArgs may raise
        return default


def _call(sa, name, default=None):
    """One of the ServerArgs methods upstream_api declares (ServerArgs.<name> on 0.5.16;
    resolution_hook.ResolvingArgs supplies them on 0.5.23). A missing method is an error, never a
    default; `default` stands in only when the method itself fails on a partial ServerArgs."""
    fn = getattr(sa, name, None)
    if fn is None:
        raise AttributeError(f"{type(sa).__name__} has no {name}(), which the layerwise resolution needs "
                             "(declared in sglang/sm120/upstream_api.py)")
    try:
        return fn()
    except Exception:  # noqa: BLE001
        return default


def incompatibilities(sa, phase: str) -> List[str]:
    """Features the layerwise backend does not (yet) handle, for this phase."""
    rules = [
        ("a non-CUDA device", _get(sa, "device", "cuda") not in ("cuda", None)),
        ("--enable-torch-compile (Dynamo)", bool(_get(sa, "enable_torch_compile", False))),
        ("--enable-dp-attention", bool(_get(sa, "enable_dp_attention", False))),
        ("an MoE all-to-all backend", (_get(sa, "moe_a2a_backend", "none") or "none") != "none"),
        ("two-batch overlap", bool(_get(sa, "enable_two_batch_overlap", False))),
        ("pipeline parallelism", (_get(sa, "pp_size", 1) or 1) > 1),
        ("speculative decoding", _get(sa, "speculative_algorithm", None) is not None),
        ("LoRA", bool(_get(sa, "enable_lora", False)) or bool(_get(sa, "lora_paths", None))),
        ("PD multiplexing", bool(_get(sa, "enable_pdmux", False))),
        ("diffusion LLM inference", _get(sa, "dllm_algorithm", None) is not None),
        ("--debug-cuda-graph", bool(_get(sa, "debug_cuda_graph", False))),
        ("--enable-memory-saver", bool(_get(sa, "enable_memory_saver", False))),
        (
            "the expert distribution recorder / EPLB",
            bool(_get(sa, "enable_eplb", False))
            or _get(sa, "expert_distribution_recorder_mode", None) is not None,
        ),
    ]
    if phase == PREFILL:
        model_config = _call(sa, "get_model_config")
        rules += [
            ("MLA attention (prefill)", bool(_call(sa, "use_mla_backend", False))),
            ("a multimodal model (prefill)", bool(getattr(model_config, "is_multimodal", False))),
        ]
    return [name for name, hit in rules if hit]


def _upstream_default(phase: str) -> str:
    if phase == DECODE:
        return "full"
    try:
        from sglang.srt.model_executor.cuda_graph_config import default_prefill_backend

        return default_prefill_backend()
    except Exception:  # noqa: BLE001 - no sglang (tests): upstream's CUDA default
        return "breakable"


# Upstream's per-backend prefill rules (ServerArgs._apply_cuda_graph_compatibility). They log their
# own warning and set the prefill backend to 'disabled'.
_UPSTREAM_PREFILL_RULES = {
    "breakable": "_disable_breakable_cudagraph_if_incompatible",
    "tc_piecewise": "_disable_tc_piecewise_cudagraph_if_incompatible",
    "full": "_disable_full_prefill_cudagraph_if_incompatible",
}


def _fall_back(sa, cfg, phase: str) -> str:
    """Give `phase` the backend upstream would have resolved for this configuration.

    Upstream skips its compatibility rules when the operator named the prefill backend
    (--cuda-graph-backend-prefill layerwise does), and they ran before this hook anyway; so the
    fallback backend is checked here against upstream's own rules for it: an MLA model must not
    get 'breakable' prefill graphs, which upstream disables for MLA ("MLA prefill takes a
    different attn-forward path under BCG"), or its prefill diverges from upstream's own, which
    runs eagerly there (docs/runner.md, "Sizes" and "Correctness")."""
    backend = _upstream_default(phase)
    getattr(cfg, phase).backend = backend
    rule = _UPSTREAM_PREFILL_RULES.get(backend) if phase == PREFILL else None
    if rule is not None:
        _call(sa, rule)
    return getattr(cfg, phase).backend


def _cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    # FlashInfer's FA2DetermineCtaTileQ, which sizes the split-kv scratch of a captured plan.
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    if packed_qo_len > 16:
        return 64
    return 16


def flashinfer_decode_workspace_bytes(
    max_bs: int, num_qo_heads: int, num_kv_heads: int, head_dim: int
) -> int:
    """Float workspace a captured FlashInfer tensor-core decode plan needs at batch `max_bs`.

    With CUDA graphs FlashInfer plans split-kv for the worst case: padded batch = total q tiles,
    tmp_v + tmp_s = heads * padded * cta_tile_q * (head_dim + 1) fp32, which at large batches
    exceeds the 384 MB default (FlashInfer then fails with 'Buffer overflow ...
    batch_prefill_tmp_s'). 25% margin, rounded up to 64 MB.
    """
    group = max(1, num_qo_heads // max(1, num_kv_heads))
    cta = _cta_tile_q(group, head_dim)
    tiles = -(-max_bs * group // cta) + max_bs - 1
    need = num_qo_heads * tiles * cta * (head_dim + 1) * 4
    need = int(need * 1.25)
    step = 64 * 1024 * 1024
    return -(-need // step) * step


def _maybe_grow_flashinfer_workspace(sa, max_bs: int) -> Optional[int]:
    backends = _call(sa, "get_attention_backends") or (None, None)
    decode_backend = backends[1] if isinstance(backends, (tuple, list)) else None
    if decode_backend != "flashinfer" or bool(_call(sa, "use_mla_backend", False)):
        return None
    hf = getattr(_call(sa, "get_model_config"), "hf_config", None)
    if hf is None:
        return None
    tp = max(1, int(_get(sa, "tp_size", 1) or 1))
    heads = int(getattr(hf, "num_attention_heads", 0) or 0)
    if heads <= 0:
        return None
    kv = int(getattr(hf, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(hf, "head_dim", 0) or (getattr(hf, "hidden_size", 0) // heads))
    need = flashinfer_decode_workspace_bytes(
        max_bs, max(1, heads // tp), max(1, kv // tp), head_dim
    )
    current = int(os.environ.get(FLASHINFER_WORKSPACE_ENV, FLASHINFER_DEFAULT_WORKSPACE))
    if need <= current:
        return None
    _set_env(FLASHINFER_WORKSPACE_ENV, str(need))
    return need


# Values the process environment had before finalize() first changed a key, so that a later
# ServerArgs without layerwise (a second Engine in the same process, e.g. the graphs-disabled
# reference of the GPU correctness test) gets the environment it would have had, whatever the
# order in which the engines were created.
_ENV_BEFORE: dict = {}  # key -> (value before finalize changed it, value finalize set)
_UNSET = object()


def _set_env(key: str, value: str) -> None:
    before = _ENV_BEFORE[key][0] if key in _ENV_BEFORE else os.environ.get(key, _UNSET)
    _ENV_BEFORE[key] = (before, value)
    os.environ[key] = value


def restore_env() -> None:
    """Undo the environment changes finalize() made in this process. A key someone else changed
    since (the operator, a test) is left alone."""
    for key, (before, ours) in _ENV_BEFORE.items():
        if os.environ.get(key) != ours:
            continue
        if before is _UNSET:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
    _ENV_BEFORE.clear()


def _locked(sa) -> set:
    return set(_get(sa, "_cuda_graph_config_locked", set()) or set())


def finalize(sa) -> Optional[Resolution]:
    # Env switches are recomputed from this ServerArgs alone (scheduler processes inherit them).
    restore_env()
    cfg = _get(sa, "cuda_graph_config")
    if cfg is None:
        return None
    phases = [p for p in (DECODE, PREFILL) if getattr(cfg, p).backend == LAYERWISE]
    if not phases:
        if _get(sa, "cuda_graph_layerwise_every_size", False):
            logger.warning(
                "--cuda-graph-layerwise-every-size has no effect: decode backend is %r",
                cfg.decode.backend,
            )
        return None
    logger.warning(
        "layerwise CUDA graphs (experimental: not yet validated under tensor parallelism or on "
        "real weights, docs/runner.md) for %s", " and ".join(phases),
    )
    fallbacks = {}
    for phase in phases:
        reasons = incompatibilities(sa, phase)
        if reasons:
            fallback = _fall_back(sa, cfg, phase)
            logger.warning(
                "layerwise CUDA graphs do not support %s yet; %s phase uses %r instead",
                ", ".join(reasons), phase, fallback,
            )
            fallbacks[phase] = reasons
    locked = _locked(sa)
    max_running = _get(sa, "max_running_requests", None)
    decode_plan = prefill_plan = None

    dec = cfg.decode
    ceiling_rule = None
    if dec.backend == LAYERWISE:
        every = bool(_get(sa, "cuda_graph_layerwise_every_size", False))
        explicit_ceiling = getattr(dec, "layerwise_full_max_bs", None)
        if explicit_ceiling is not None and explicit_ceiling <= 0:
            every = True
        ceiling, top, ceiling_rule = _decode_sizes(sa, dec, locked, max_running)
        explicit = list(dec.bs) if (DECODE, "bs") in locked and dec.bs else None
        decode_plan = plan_decode(
            ceiling=max(1, min(ceiling, top)), every_size=every, max_bs=top, explicit_sizes=explicit
        )
        dec.bs = list(decode_plan.sizes)
        dec.max_bs = decode_plan.max_bs
        dec.layerwise_full_max_bs = decode_plan.full_max_bs
        grown = _maybe_grow_flashinfer_workspace(sa, decode_plan.max_bs)
        if grown:
            logger.info(
                "layerwise decode up to bs %d: FlashInfer workspace raised to %d MB",
                decode_plan.max_bs, grown // (1024 * 1024),
            )

    pre = cfg.prefill
    if pre.backend == LAYERWISE:
        if _get(sa, "cuda_graph_tc_compiler", None) is not None or (PREFILL, "tc_compiler") in locked:
            logger.warning(
                "--piecewise-cuda-graph-compiler / tc_compiler is ignored by the layerwise "
                "backend (it never calls torch.compile)"
            )
        chunk = int(_get(sa, "chunked_prefill_size", 0) or 0)
        max_tokens = int(pre.max_bs or chunk or 8192)
        explicit = list(pre.bs) if (PREFILL, "bs") in locked and pre.bs else None
        slots = pre.full_prefill_max_req or default_prefill_req_slots(chunk, max_running)
        prefill_plan = plan_prefill(max_tokens=max_tokens, explicit_buckets=explicit, req_slots=slots)
        pre.bs = list(prefill_plan.buckets)
        pre.max_bs = max(prefill_plan.buckets)
        pre.full_prefill_max_req = prefill_plan.req_slots

    if decode_plan or prefill_plan:
        # a malformed lean MoE switch or prefill cap fails here, before the model loads
        if lean_moe_requested():
            zero_copy.requested()
            if prefill_plan:
                lean_prefill_cap()
        if prefill_plan:
            prefill_attention.requested()
        if decode_plan:
            decode_attention.requested()
        _set_env(DYNAMO_FREE_ENV, "1")
        logger.info(
            "layerwise CUDA graphs: decode %s, prefill %s",
            _describe_decode(decode_plan),
            _describe_prefill(prefill_plan),
        )
        if decode_plan:
            logger.info("layerwise decode full-graph ceiling: %s", ceiling_rule)
    return Resolution(decode_plan, prefill_plan, fallbacks, ceiling_rule)


def _describe_decode(plan: Optional[DecodePlan]) -> str:
    if plan is None:
        return "not layerwise"
    full = plan.full_sizes
    lw = plan.layerwise_sizes
    head = f"full graphs for bs <= {plan.full_max_bs} ({len(full)} sizes), " if full else ""
    return f"{head}layerwise {lw[0]}..{lw[-1]} ({len(lw)} sizes)" if lw else head.rstrip(", ")


def _describe_prefill(plan: Optional[PrefillPlan]) -> str:
    if plan is None:
        return "not layerwise"
    b = plan.buckets
    return f"{len(b)} token buckets {b[0]}..{b[-1]}, {plan.req_slots} request slots"


def resolved_cuda_graph_config(server_args: Any):
    """The CUDA-graph config in force at run time: on 0.5.16 the ServerArgs field (resolved in
    place); on 0.5.23 the published exec.graph bag, since that record keeps the raw input."""
    from sglang.sm120 import upstream_api

    if upstream_api.upstream_present() and upstream_api.has("runtime_context.get_exec"):
        return upstream_api.require("runtime_context.get_exec")().graph.cuda_graph_config
    return _get(server_args, "cuda_graph_config")


def phase_backend(server_args: Any, phase: str) -> Optional[str]:
    cfg = resolved_cuda_graph_config(server_args)
    return getattr(getattr(cfg, phase, None), "backend", None) if cfg is not None else None
