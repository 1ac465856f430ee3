"""Which NVFP4 GEMM backend `--fp4-gemm-backend auto` picks in the fork.

On SM120 the fork's own kernels (`sm120`) when their library loads; everywhere else upstream's
choice stands (None). On SM90 they stay selectable by name, instead of Marlin.
The choice is provisional: the backend self-checks on the first layer it loads (fp4_selfcheck),
and a failure disables it here for the process, so `auto` then gives upstream's choice.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

logger = logging.getLogger(__name__)

_disabled_reason: Optional[str] = None


def disable_sm120(reason: str) -> None:
    """The self-check failed: `auto` never picks sm120 again in this process."""
    global _disabled_reason
    _disabled_reason = reason


def picks_sm120(capability) -> bool:
    """`auto` picks the fork's kernels on this compute capability (when their library loads)."""
    return tuple(capability)[0] == 12


def sm120_gpu_with_kernels(serves: str) -> bool:
    """This process's GPU is one `auto` gives the fork's kernels and their library loads (else one
    warning naming what keeps upstream's backend: `serves`, e.g. "NVFP4 GEMMs")."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available() or not picks_sm120(torch.cuda.get_device_capability()):
        return False
    from sglang.sm120 import kernels

    try:
        kernels.load()
    except RuntimeError as e:
        logger.warning("SM120 GPU but the sglang-sm120 kernel library is not loadable (%s); "
                       "%s use upstream's backend", e, serves)
        return False
    return True


def auto_backend_choice() -> Optional[str]:
    if _disabled_reason is not None or not sm120_gpu_with_kernels("NVFP4 GEMMs"):
        return None
    logger.info("NVFP4 GEMM backend: sm120 (fork kernels) on this SM120 GPU, once its self-check passes")
    return "sm120"


def initialize_upstream_config(backend: str) -> None:
    """Run upstream's initialize_fp4_gemm_config for `backend` ("auto", "sm120", "marlin", ...) on
    either base: 0.5.16 takes the server args, 0.5.23 reads the published kernel config, shown
    `backend` for the duration of the call."""
    from sglang.sm120 import upstream_api
    from sglang.srt.layers.quantization import fp4_utils

    args = SimpleNamespace(fp4_gemm_runner_backend=backend)
    if not upstream_api.has("fp4_utils.get_exec"):
        fp4_utils.initialize_fp4_gemm_config(args)
        return
    published = fp4_utils.get_exec
    fp4_utils.get_exec = lambda: SimpleNamespace(kernel=args)
    try:
        fp4_utils.initialize_fp4_gemm_config()
    finally:
        fp4_utils.get_exec = published


def upstream_resolution(requested: str) -> str:
    """The backend upstream's initialize_fp4_gemm_config makes of `requested` on this process's
    GPU (or the card `plan.cards.faked_card` fakes), without the fork's `auto` choice; the process's
    own backend is left as it was."""
    global _disabled_reason
    from sglang.srt.layers.quantization import fp4_utils

    saved, before = _disabled_reason, fp4_utils.FP4_GEMM_RUNNER_BACKEND
    _disabled_reason = "upstream's own resolution asked"
    try:
        initialize_upstream_config(requested)
        return fp4_utils.get_fp4_gemm_runner_backend().value
    finally:
        _disabled_reason = saved
        fp4_utils.FP4_GEMM_RUNNER_BACKEND = before
