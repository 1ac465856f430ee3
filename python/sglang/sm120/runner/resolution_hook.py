"""Layerwise resolution on bases whose ServerArgs resolve through a declarative pipeline (0.5.23).

There a resolution step reads the values decided so far through `resolving_view(server_args)`
and writes by declaring them (`declare_resolution`); the record itself is never edited. The
series imports this module from arg_groups/cuda_graph_hook.py, and importing it wraps the last
step of upstream's pipeline (LAST_STEP) with upstream's `register_resolution_hook`: after it,
every value upstream resolves is final (the memory-derived decode max batch size and chunked
prefill size, which handle_gpu_memory_settings sets long after handle_cuda_graph_config; the
attention and MoE backends), and `config.finalize` plans the layerwise sizes on a copy of the
resolved CUDA-graph config, which is then declared. That is where 0.5.16 runs it too: at the end
of ServerArgs.__post_init__ (hooks.finalize_server_args); there this module is never imported.
"""
from __future__ import annotations

import copy

from sglang.sm120 import upstream_api

from .config import finalize

SOURCE = "sglang_sm120_layerwise"


class ResolvingArgs:
    """What `config.finalize` reads as ServerArgs, over a base-0.5.23 record mid-resolution:
    fields come from the live resolving view, except `cuda_graph_config` (the copy being planned);
    the ServerArgs methods finalize calls on 0.5.16 map to 0.5.23's functions of the record."""

    def __init__(self, record, cuda_graph_config):
        self._record = record
        self._view = upstream_api.require("resolving_view")(record)
        self.cuda_graph_config = cuda_graph_config

    def __getattr__(self, name):
        return getattr(self._view, name)

    def get_model_config(self):
        return upstream_api.require("model_override_base.model_config_of")(self._record)

    def use_mla_backend(self):
        return upstream_api.require("model_override_base.use_mla_backend")(self._record)

    def get_attention_backends(self):
        return upstream_api.require("attention_backends_of")(self._view)

    def _apply_rule(self, anchor: str):
        """Run one of upstream's prefill compatibility rules on the planned config: declare it, let
        the rule declare 'disabled' if it must, and read the outcome back."""
        upstream_api.require("declare_resolution")(self._record, SOURCE, cuda_graph_config=copy.deepcopy(
            self.cuda_graph_config))
        upstream_api.require(anchor)(self._record)
        self.cuda_graph_config.prefill.backend = self._view.cuda_graph_config.prefill.backend

    def _disable_breakable_cudagraph_if_incompatible(self):
        self._apply_rule("cuda_graph_hook.disable_breakable_cudagraph_if_incompatible")

    def _disable_full_prefill_cudagraph_if_incompatible(self):
        self._apply_rule("cuda_graph_hook.disable_full_prefill_cudagraph_if_incompatible")

    def upstream_default_decode_max_bs(self) -> int:
        """The decode max batch size upstream's memory step picks for this card and these flags
        when the operator names none: that step run again on a copy of the record (its own list of
        declarations), the decode sizes cleared."""
        view, declare = upstream_api.require("resolving_view"), upstream_api.require("declare_resolution")
        scratch = copy.copy(self._record)
        scratch._resolved_overrides = list(self._record._resolved_overrides)
        cfg = copy.deepcopy(view(self._record).cuda_graph_config)
        cfg.decode.max_bs = cfg.decode.bs = None
        declare(scratch, SOURCE, cuda_graph_config=cfg)
        upstream_api.require("resolution_step.handle_gpu_memory_settings")(scratch)
        return view(scratch).cuda_graph_config.decode.max_bs


# The last run_hook step of upstream's run_resolution_pipeline (a CPU test checks it stays last).
LAST_STEP = upstream_api.require("resolution_step.last").__name__


def after_resolution(server_args, previous) -> None:
    previous(server_args)
    resolved = upstream_api.require("resolving_view")(server_args).cuda_graph_config
    if resolved is None:
        return
    planned = copy.deepcopy(resolved)
    finalize(ResolvingArgs(server_args, planned))
    upstream_api.require("declare_resolution")(server_args, SOURCE, cuda_graph_config=planned)


upstream_api.require("register_resolution_hook")(LAST_STEP)(after_resolution)
