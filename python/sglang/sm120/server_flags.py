"""CLI flags the fork restores or adds to `sglang serve` / `launch_server`.

`--enable-piecewise-cuda-graph` (removed upstream by 0.5.14) on every base. Where a base dropped
upstream's own legacy piecewise flags (0.5.23; 0.5.16 still has them as deprecated aliases),
`add_restored_flags` gives them back with 0.5.16's meaning, so one launch script runs on both:
`--disable-piecewise-cuda-graph` = `--cuda-graph-backend-prefill disabled`,
`--piecewise-cuda-graph-tokens` = `--cuda-graph-bs-prefill`, `--piecewise-cuda-graph-max-tokens` =
`--cuda-graph-max-bs-prefill`, and `--piecewise-cuda-graph-compiler`, which only ever chose the
compiler of the torch.compile piecewise backend (gone from 0.5.23; the layerwise backend ignores
it on 0.5.16 too), is accepted and ignored with a warning.
"""
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


class IgnoredPiecewiseCompilerAction(argparse.Action):
    """`--piecewise-cuda-graph-compiler {eager,inductor}` on a base without the torch.compile
    piecewise backend: accepted (old launch scripts pass it) and ignored, with a warning."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        logger.warning("%s %s is ignored: this sglang base has no torch.compile piecewise backend "
                       "for it to configure (the layerwise backend never calls torch.compile)",
                       option_string, values)


def _legacy_piecewise_flags(upstream_api):
    """(flag, add_argument keywords) of upstream's legacy piecewise flags, as 0.5.16 defines them."""
    const = upstream_api.require("argparse_actions.DeprecatedStoreConstAction")
    alias = upstream_api.require("argparse_actions.DeprecatedAliasStoreAction")
    disabled = upstream_api.require("cuda_graph_config.Backend").DISABLED
    return (
        ("--disable-piecewise-cuda-graph", dict(
            action=const, dest="cuda_graph_backend_prefill", const_value=disabled,
            new_flag="--cuda-graph-backend-prefill=disabled",
            help="Deprecated alias for --cuda-graph-backend-prefill=disabled (restored by sglang-sm120).")),
        ("--piecewise-cuda-graph-tokens", dict(
            action=alias, type=int, nargs="+", dest="cuda_graph_bs_prefill", new_flag="--cuda-graph-bs-prefill",
            help="Deprecated alias for --cuda-graph-bs-prefill (restored by sglang-sm120).")),
        ("--piecewise-cuda-graph-max-tokens", dict(
            action=alias, type=int, dest="cuda_graph_max_bs_prefill", new_flag="--cuda-graph-max-bs-prefill",
            help="Deprecated alias for --cuda-graph-max-bs-prefill (restored by sglang-sm120).")),
        ("--piecewise-cuda-graph-compiler", dict(
            action=IgnoredPiecewiseCompilerAction, type=str, choices=["eager", "inductor"],
            help="Accepted for old launch scripts and ignored (sglang-sm120): this base has no "
            "torch.compile piecewise backend.")),
    )


def add_restored_flags(parser: argparse.ArgumentParser) -> None:
    """Patch 0002 on bases that dropped the legacy piecewise flags: `--enable-piecewise-cuda-graph`
    plus each legacy flag the parser does not have yet."""
    from sglang.sm120 import upstream_api

    parser.add_argument(
        "--enable-piecewise-cuda-graph", action=EnablePiecewiseCudaGraphAction,
        dest="cuda_graph_backend_prefill",
        help="Piecewise CUDA graphs without torch.compile (sglang-sm120). Restored for old launch "
        "scripts; selects a Dynamo-free segmented backend and logs which.")
    for flag, kwargs in _legacy_piecewise_flags(upstream_api):
        if flag not in parser._option_string_actions:
            parser.add_argument(flag, **kwargs)
            RESTORED_LEGACY_FLAGS.add(flag)


# Legacy piecewise flags add_restored_flags added because this base lacks them (empty on 0.5.16,
# whose patch 0002 adds --enable-piecewise-cuda-graph alone); upstream alone refuses these.
RESTORED_LEGACY_FLAGS: set = set()


def restored_legacy_flags() -> frozenset:
    """The legacy piecewise flags only the fork accepts on this base (builds the CLI once)."""
    from sglang.srt.server_args import ServerArgs

    ServerArgs.add_cli_args(argparse.ArgumentParser())
    return frozenset(RESTORED_LEGACY_FLAGS)
