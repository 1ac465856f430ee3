"""CLI flags the fork restores or adds to `sglang serve` / `launch_server`."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

# CLI choices the fork adds to upstream's lists: (extension point, the list it extends, choice),
# both named as upstream_api anchors.
UPSTREAM_CHOICES = (("add_fp4_gemm_runner_backend_choices", "FP4_GEMM_RUNNER_BACKEND_CHOICES", "sm120"),)


def register_upstream_choices() -> None:
    """Add the fork's choices through upstream's add_*_choices extension points (bases that have
    them; on 0.5.16 patch 0201 lists them itself). Safe to call for every parser built."""
    from sglang.sm120 import upstream_api

    for add, listed, choice in UPSTREAM_CHOICES:
        if upstream_api.has(add) and choice not in upstream_api.require(listed):
            upstream_api.require(add)([choice])


class EnablePiecewiseCudaGraphAction(argparse.Action):
    """`--enable-piecewise-cuda-graph` (removed upstream by 0.5.14) restored as a real flag: it
    selects the layerwise runner for every phase whose backend was not chosen explicitly, so
    `--disable-piecewise-cuda-graph` and `--cuda-graph-backend-{decode,prefill}` win in either
    order."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from sglang.sm120.runner.config import LAYERWISE, select_layerwise_for_unset_phases

        phases = select_layerwise_for_unset_phases(namespace)
        if not phases:
            logger.warning("%s: decode and prefill backends already chosen (%s, %s); leaving them",
                           option_string, namespace.cuda_graph_backend_decode,
                           namespace.cuda_graph_backend_prefill)
            return
        logger.warning("%s: selecting the Dynamo-free '%s' CUDA graph backend for %s "
                       "(same as --cuda-graph-backend-%s=%s)", option_string, LAYERWISE,
                       " and ".join(phases), "/".join(phases), LAYERWISE)
