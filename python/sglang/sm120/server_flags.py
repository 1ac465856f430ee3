"""CLI flags the fork restores or adds to `sglang serve` / `launch_server`."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

# Until the layerwise runner lands, the restored flag maps to upstream's Dynamo-free segmented
# prefill backend, so old launch scripts start instead of failing on an unknown argument.
PIECEWISE_PREFILL_BACKEND = "breakable"


class EnablePiecewiseCudaGraphAction(argparse.Action):
    """`--enable-piecewise-cuda-graph` (removed upstream by 0.5.14) restored as a real flag."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, "cuda_graph_backend_prefill", PIECEWISE_PREFILL_BACKEND)
        logger.warning(
            "%s: selecting the Dynamo-free '%s' prefill CUDA graph backend "
            "(same as --cuda-graph-backend-prefill=%s)",
            option_string, PIECEWISE_PREFILL_BACKEND, PIECEWISE_PREFILL_BACKEND,
        )
