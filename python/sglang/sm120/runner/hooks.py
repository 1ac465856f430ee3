"""Entry points the patch series calls. Each is one line at its call site upstream.

patch 0102 (server_args):     finalize_server_args(server_args) from ServerArgs.__post_init__ on
                              0.5.16; on 0.5.23 runner.resolution_hook (after the last step of
                              upstream's resolution pipeline)
patch 0103 (runner backends): decode_backend(runner) / prefill_backend(runner)
patch 0104 (graph setup):     decode_runner_class(model_runner, default) /
                              prefill_runner_class(model_runner, default) /
                              finish_captures(model_runner)
patch 0105 (FusedMoE):        sglang.sm120.runner.boundary.boundary_active / cross
patch 0113 (RadixAttention):  sglang.sm120.runner.boundary.attention_island_active / cross_attention
patch 0106/0107 (helpers):    sglang.sm120.runner.dynamo_free.compile_unless_dynamo_free
"""
from __future__ import annotations

from sglang.sm120 import upstream_api

from .config import LAYERWISE, finalize, phase_backend

# The series calls in here, so this is where an installed fork first relies on upstream: check
# every upstream anchor of the installed base once (UpstreamAnchorError names what is missing).
if upstream_api.upstream_present():
    upstream_api.check_installed()


class InPlaceArgs:
    """A base-0.5.16 ServerArgs at the end of its __post_init__, as `config.finalize` reads it:
    every attribute is the record's (finalize edits its cuda_graph_config in place), plus what only
    upstream's resolution can say."""

    def __init__(self, server_args):
        object.__setattr__(self, "_record", server_args)

    def __getattr__(self, name):
        return getattr(self._record, name)

    def upstream_default_decode_max_bs(self) -> int:
        """The decode max batch size upstream's memory step picks for this card and these flags
        when the operator names none: that step run again on a copy, its decode sizes cleared."""
        import copy

        from sglang.sm120 import upstream_api
        from sglang.srt import server_args as upstream

        scratch = copy.copy(self._record)
        scratch.cuda_graph_config = copy.deepcopy(self._record.cuda_graph_config)
        scratch.cuda_graph_config.decode.max_bs = scratch.cuda_graph_config.decode.bs = None
        gpu_mem = upstream.get_device_memory_capacity(scratch.device)
        upstream_api.require("ServerArgs._handle_gpu_memory_settings")(scratch, gpu_mem)
        return scratch.cuda_graph_config.decode.max_bs


def finalize_server_args(server_args) -> None:
    finalize(InPlaceArgs(server_args))


def decode_backend(cuda_graph_runner):
    from .backend import make_decode_backend

    return make_decode_backend(cuda_graph_runner)


def prefill_backend(cuda_graph_runner):
    from .backend import make_prefill_backend

    return make_prefill_backend(cuda_graph_runner)


def decode_runner_class(model_runner, default):
    if phase_backend(model_runner.server_args, "decode") != LAYERWISE:
        # upstream's decode runner captures in its constructor: a layerwise prefill's background
        # module builds must be done first (another thread's CUDA calls break a global capture)
        from .prewarm import join_background_builds

        join_background_builds()
        return default
    from .runners import LayerwiseDecodeRunner
    from .startup import begin

    begin(model_runner)

    return LayerwiseDecodeRunner


def prefill_runner_class(model_runner, default):
    if phase_backend(model_runner.server_args, "prefill") != LAYERWISE:
        return default
    from .runners import LayerwisePrefillRunner
    from .startup import begin

    begin(model_runner)

    return LayerwisePrefillRunner


def finish_captures(model_runner) -> None:
    from .startup import finish

    finish(model_runner)
