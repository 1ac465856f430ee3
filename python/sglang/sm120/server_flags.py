"""CLI flags the fork restores or adds to `sglang serve` / `launch_server`."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)

# The restored flag maps to upstream's Dynamo-free segmented prefill backend. It moves to the
# layerwise runner (sglang.sm120.runner.config.select_layerwise_for_unset_phases) once that
# runner's greedy outputs match graphs-disabled on a GPU; they did not yet (docs/runner.md).
PIECEWISE_PREFILL_BACKEND = "breakable"


class EnablePiecewiseCudaGraphAction(argparse.Action):
    """`--enable-piecewise-cuda-graph` (removed upstream by 0.5.14) restored as a real flag.
    An explicit prefill choice (`--disable-piecewise-cuda-graph`, `--cuda-graph-backend-prefill`)
    wins in either order."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, "cuda_graph_backend_prefill", None) is not None:
            logger.warning("%s: prefill backend already chosen (%s); leaving it",
                           option_string, namespace.cuda_graph_backend_prefill)
            return
        namespace.cuda_graph_backend_prefill = PIECEWISE_PREFILL_BACKEND
        logger.warning(
            "%s: selecting the Dynamo-free '%s' prefill CUDA graph backend "
            "(same as --cuda-graph-backend-prefill=%s)",
            option_string, PIECEWISE_PREFILL_BACKEND, PIECEWISE_PREFILL_BACKEND,
        )
