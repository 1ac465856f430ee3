"""Upstream's server-argument resolution for a card, with and without the fork's flags.

`resolve(model_dir, card, argv)` runs upstream's own resolution (prepare_server_args, and on
0.5.23 its pipeline) inside `faked_card(card)` and returns what it decided. `upstream_argv(argv)`
is the same command line as upstream alone takes it: the fork's flags and choices left out
(and named, since upstream alone would refuse them).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .cards import Card, faked_card

# The fork's own flags (no value) and the fork's choices of upstream flags.
FORK_SWITCHES = ("--enable-piecewise-cuda-graph", "--cuda-graph-layerwise-every-size", "--reject-unknown-model")
FORK_CHOICES = {"--cuda-graph-backend-decode": "layerwise", "--cuda-graph-backend-prefill": "layerwise",
                "--fp4-gemm-backend": "sm120", "--moe-runner-backend": "sm120"}


@dataclass
class Resolved:
    decode: dict  # the decode phase of cuda_graph_config (backend, max_bs, bs, layerwise_full_max_bs)
    prefill: dict
    chunked_prefill_size: Optional[int]
    max_running_requests: Optional[int]
    attention: dict  # attention_backend, prefill_attention_backend, decode_attention_backend
    moe_runner_backend: Optional[str]
    quantization: Optional[str]  # as resolved (the checkpoint's, or --quantization)
    fp4_gemm_backend: Optional[str]  # as requested on the command line (auto unless named)
    mem_fraction_static: Optional[float]
    tp_size: int
    log: List[str] = field(default_factory=list)  # the fork's messages while resolving


def upstream_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """(argv as upstream alone takes it, what was left out). `--enable-piecewise-cuda-graph`, the
    `layerwise` backend and the other fork flags go; on a base without the legacy piecewise flags
    those go too (upstream alone refuses them)."""
    from sglang.sm120.server_flags import restored_legacy_flags

    lacks = restored_legacy_flags()
    out, dropped, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        name, eq, inline = a.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
        width = 1 if eq else 2
        if name in FORK_SWITCHES:
            dropped.append(a)
            i += 1
        elif name in FORK_CHOICES and value == FORK_CHOICES[name]:
            dropped.append(" ".join(argv[i:i + width]))
            i += width
        elif name == "--cuda-graph-config" and value is not None and "layerwise" in value:
            kept = _without_layerwise(json.loads(value))
            dropped.append(f"{name} (layerwise parts)")
            out += [name, json.dumps(kept)] if kept else []
            i += width
        elif name in lacks:
            n = i + 1
            while n < len(argv) and not argv[n].startswith("--") and not eq:
                n += 1
            dropped.append(" ".join(argv[i:n]))
            i = n
        else:
            out.append(a)
            i += 1
    return out, dropped


def _without_layerwise(cfg: dict) -> dict:
    kept = {}
    for phase, settings in cfg.items():
        s = {k: v for k, v in settings.items() if k != "layerwise_full_max_bs"
             and not (k == "backend" and v == "layerwise")}
        if s:
            kept[phase] = s
    return kept


@contextlib.contextmanager
def _kept_environment():
    """Resolution sets process environment variables (the fork's Dynamo-free switch, FlashInfer's
    workspace, upstream's own); a plan leaves the process as it found it."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for k in set(os.environ) - set(before):
            del os.environ[k]
        os.environ.update(before)


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _phase(cfg) -> dict:
    keys = ("backend", "max_bs", "bs", "layerwise_full_max_bs", "full_prefill_max_req")
    return {k: getattr(cfg, k, None) for k in keys}


def _checkpoint_quantization(view) -> Optional[str]:
    """The method upstream's ModelConfig reads from the checkpoint (config.json's
    quantization_config, ModelOpt's hf_quant_config.json) when --quantization is not given:
    server args leave it None until the model loads. Upstream memoizes the ModelConfig on the
    server args (DSA resolution has built it already)."""
    from sglang.sm120 import upstream_api

    if upstream_api.has("ServerArgs.get_model_config"):  # 0.5.16
        return view.get_model_config().quantization
    return upstream_api.require("model_override_base.model_config_of")(view).quantization


def resolve(model_dir: str, card: Card, argv: List[str]) -> Resolved:
    """Upstream's resolution (the fork's hooks included) of `--model-path model_dir` + argv, as on
    `card`."""
    from sglang.sm120 import upstream_api

    prepare_server_args = upstream_api.require("prepare_server_args")
    log = _Messages()
    fork_logger = logging.getLogger("sglang.sm120")
    level = fork_logger.level
    fork_logger.addHandler(log)
    fork_logger.setLevel(logging.INFO)
    try:
        with faked_card(card), _kept_environment():
            sa = prepare_server_args(["--model-path", model_dir] + list(argv))
            if hasattr(sa, "resolve_once"):  # 0.5.23: declared over the raw record
                sa.resolve_once()
                view = upstream_api.require("resolving_view")(sa)
            else:  # 0.5.16: resolved in place by __post_init__
                view = sa
            cfg = view.cuda_graph_config
            return Resolved(
                decode=_phase(cfg.decode), prefill=_phase(cfg.prefill),
                chunked_prefill_size=view.chunked_prefill_size,
                max_running_requests=view.max_running_requests,
                attention={k: getattr(view, k, None) for k in
                           ("attention_backend", "prefill_attention_backend", "decode_attention_backend")},
                moe_runner_backend=getattr(view, "moe_runner_backend", None),
                quantization=getattr(view, "quantization", None) or _checkpoint_quantization(view),
                fp4_gemm_backend=getattr(view, "fp4_gemm_runner_backend", None),
                mem_fraction_static=view.mem_fraction_static, tp_size=view.tp_size,
                log=list(log.lines),
            )
    finally:
        fork_logger.removeHandler(log)
        fork_logger.setLevel(level)


def captured_decode_sizes(resolved: Resolved) -> List[int]:
    """The decode batch sizes a server captures: the resolved list, clamped at start-up to the
    request pool --max-running-requests sizes (upstream's get_batch_sizes_to_capture drops sizes
    above the pool and adds the pool size). 0.5.23 lowers its list to it while resolving already;
    0.5.16 leaves that to start-up."""
    sizes, pool = list(resolved.decode["bs"] or []), resolved.max_running_requests
    if pool is None or not sizes:
        return sizes
    return sorted({s for s in sizes if s <= pool} | ({pool} if max(sizes) > pool else set()))
