"""Which MoE runner backend `--moe-runner-backend auto` picks for ModelOpt NVFP4 experts in the
fork, and the switch back to upstream's choice when the sm120 MoE self-check fails.

`auto` (patch 0202, in upstream's quantization-driven resolution of the MoE backend): `sm120`
on SM120 GPUs when the kernel library loads (fp4_backend.sm120_gpu_with_kernels), else upstream's
choice (flashinfer_cutlass on SM120). The choice is provisional: the first NVFP4 MoE layer
self-checks the kernel (fp4_moe_selfcheck) and a failure hands the process to upstream's choice.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

logger = logging.getLogger(__name__)

_disabled_reason: Optional[str] = None


def auto_moe_backend_choice() -> Optional[str]:
    """"sm120" where `auto` gives NVFP4 MoE layers the fork's grouped kernel, else None."""
    from sglang.sm120 import fp4_backend

    if _disabled_reason is not None or not fp4_backend.sm120_gpu_with_kernels("NVFP4 MoE layers"):
        return None
    logger.info("NVFP4 MoE runner backend: sm120 (the fork's grouped W4A16 kernel) on this SM120 GPU, "
                "once its self-check passes")
    return "sm120"


def upstream_moe_choice() -> str:
    """What upstream makes of `--moe-runner-backend auto` for ModelOpt NVFP4 on this GPU, without
    the fork's choice: its own resolution function asked (flashinfer_cutlass on SM120); "auto"
    where it leaves the choice to the quant method (marlin on SM80-SM90)."""
    global _disabled_reason
    from sglang.srt.arg_groups.overrides import _moe_runner_backend_quant_constraints

    saved, _disabled_reason = _disabled_reason, "upstream's own resolution asked"
    try:
        view = SimpleNamespace(moe_runner_backend="auto", quantization="modelopt_fp4", moe_a2a_backend="none")
        return _moe_runner_backend_quant_constraints(view).get("moe_runner_backend", "auto")
    finally:
        _disabled_reason = saved


def set_process_backend(name: str) -> None:
    """This process's MoE runner backend (what get_moe_runner_backend() answers) becomes `name`."""
    from sglang.srt.layers.moe import utils as moe_utils

    moe_utils.get_flags().moe.runner_backend = moe_utils.MoeRunnerBackend(name)


def fall_back_to_upstream(reason: str) -> str:
    """The sm120 MoE self-check failed: `auto` never picks sm120 again in this process, and the
    process's MoE runner backend becomes upstream's choice; its name."""
    global _disabled_reason
    _disabled_reason = reason
    choice = upstream_moe_choice()
    set_process_backend(choice)
    return choice
