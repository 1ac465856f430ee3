"""CLI flags the fork restores or adds to `sglang serve` / `launch_server`."""
from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


class EnablePiecewiseCudaGraphAction(argparse.Action):
    """`--enable-piecewise-cuda-graph` (removed upstream by 0.5.14) restored as a real flag: it
    selects the Dynamo-free layerwise runner for every phase not chosen explicitly, so
    `--disable-piecewise-cuda-graph` or `--cuda-graph-backend-*` still win in any order."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("nargs", 0)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from sglang.sm120.runner.config import select_layerwise_for_unset_phases

        phases = select_layerwise_for_unset_phases(namespace)
        logger.warning(
            "%s: layerwise CUDA graphs (no torch.compile) for %s",
            option_string, ", ".join(phases) or "no phase (both chosen explicitly)",
        )
