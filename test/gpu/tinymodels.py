"""Tiny models for GPU tests, made on demand by the factory (`python -m sglang.sm120.tiny`)."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

# GLM-5's DSA attention on SM90 with the kernels the GPU-host wheelhouse carries. Upstream's
# defaults there (bf16 KV cache) are prefill flashmla_sparse, decode fa3, and dense MHA through
# FA3 for prefills of at most index_topk tokens; FA3 (sgl_kernel/flash_ops.abi3.so) is slimmed
# out of the wheelhouse, so decode uses FlashMLA's sparse kernel too (sgl_kernel/flashmla_ops,
# kept) and the dense-MHA prefill threshold is 0 (every prefill takes the sparse MLA path). The
# indexer needs DeepGEMM (sgl-deep-gemm) in every case. SGLANG_SM120_TEST_DSA_ARGS="" runs
# upstream's own defaults instead (needs FA3).
DSA_ARCH = "glm_moe_dsa"
DSA_SM90_FLAGS = [
    "--attention-backend", "dsa",
    "--dsa-prefill-backend", "flashmla_sparse",
    "--dsa-decode-backend", "flashmla_sparse",
    "--kv-cache-dtype", "bfloat16",
    "--page-size", "64",
]
DSA_SM90_ENV = {"SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0"}
ENV_DSA_ARGS = "SGLANG_SM120_TEST_DSA_ARGS"


def dsa_flags() -> list:
    raw = os.environ.get(ENV_DSA_ARGS)
    return shlex.split(raw) if raw is not None else list(DSA_SM90_FLAGS)


def dsa_env() -> dict:
    """Environment of a DSA server: the SM90 threshold unless upstream's defaults were asked for."""
    return dict(DSA_SM90_ENV) if os.environ.get(ENV_DSA_ARGS) is None else {}


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
# SGLANG_SM120_GPU_MAX_TOKENS=N caps the KV pool of every engine/server the GPU tests start (so
# several of them can share one GPU); None: sglang sizes it from --mem-fraction-static
MAX_TOKENS = int(os.environ.get("SGLANG_SM120_GPU_MAX_TOKENS", "0")) or None


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    root = os.environ.get("SGLANG_SM120_TINY_DIR")
    return Path(root) if root else tmp_path_factory.mktemp("tiny")


def tiny_model(root: Path, arch: str, quant: str) -> Path:
    out = root / f"{arch}-{quant}"
    if not (out / "config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "sglang.sm120.tiny", "--arch", arch, "--quant", quant, "--out", str(out)],
            check=True,
            timeout=1200,
        )
    return out
