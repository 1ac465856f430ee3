"""What the layerwise GPU tests share: the engines' parallel sizes and KV cap, the tiny models'
folder (a session fixture), and the DSA flags as engine keyword arguments. The tiny models'
server flags and their build on demand are sglang.sm120.tiny.serving's."""
import os
from pathlib import Path

import pytest

from sglang.sm120 import settings
from sglang.sm120.tiny.serving import ENV_DSA_ARGS, dsa_flags


def dsa_engine_kwargs() -> dict:
    """dsa_flags() as sglang.Engine keyword arguments (flags are '--name value' pairs)."""
    flags = dsa_flags()
    if len(flags) % 2:
        raise ValueError(f"{ENV_DSA_ARGS}: expected '--flag value' pairs, got {flags}")
    return {flags[i].lstrip("-").replace("-", "_"): int(v) if v.isdigit() else v
            for i, v in ((i, flags[i + 1]) for i in range(0, len(flags), 2))}


# Tensor- and expert-parallel sizes of the engines the layerwise GPU tests start (2 on a 2-GPU
# host); sglang takes expert parallelism only over the whole TP group (ep_size == tp_size).
TP = int(os.environ.get("SGLANG_SM120_TP", "1"))
EP = int(os.environ.get("SGLANG_SM120_EP", "1"))
if EP not in (1, TP):
    raise ValueError(f"SGLANG_SM120_EP={EP}: expert parallelism spans the TP group, so it is 1 or "
                     f"SGLANG_SM120_TP ({TP})")
# result and log names of a parallel run: "", "-tp2" or "-tp2-ep2"
PARALLEL_SUFFIX = (f"-tp{TP}" if TP > 1 else "") + (f"-ep{EP}" if EP > 1 else "")
# SGLANG_SM120_GPU_MOE_BACKEND=sm120 runs the NVFP4 models' experts on the fork's grouped W4A16 kernel
# (--moe-runner-backend sm120) in every engine, the reference included; the grids then run the
# NVFP4 models only (bf16 experts have no such backend) and name their results "...-moe-sm120".
MOE_BACKEND = settings.get("SGLANG_SM120_GPU_MOE_BACKEND")  # a bad value: ValueError naming it
MOE_SUFFIX = f"-moe-{MOE_BACKEND}" if MOE_BACKEND else ""
# SGLANG_SM120_GPU_MAX_TOKENS=N caps the KV pool of every engine/server the GPU tests start (so
# several of them can share one GPU); None: sglang sizes it from --mem-fraction-static
MAX_TOKENS = int(os.environ.get("SGLANG_SM120_GPU_MAX_TOKENS", "0")) or None


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    root = os.environ.get("SGLANG_SM120_TINY_DIR")
    return Path(root) if root else tmp_path_factory.mktemp("tiny")
