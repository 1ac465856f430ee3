"""How the tiny models are served on the GPU test host (an SM90 H200 with the wheelhouse's kernels).

The server flags, the DSA model's flags and environment, and building a model on demand, shared by
the GPU tests (test/gpu) and the lab's repeat probe, so a probe serves exactly what the tests
serve. Servers start through sglang.sm120.launcher.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

from sglang.sm120 import settings

# Server flags of the tiny models, chosen to start fast on a fresh H200 host.
# SGLANG_SM120_TEST_SERVER_ARGS="..." (shell syntax) replaces the whole list.
DEFAULT_SERVER_ARGS: List[str] = [
    # Triton attention: FlashInfer attention JIT-compiles with nvcc at first use (minutes) and the
    # host's sgl_kernel has no FA3. Triton's MLA kernels special-case the MLA head sizes used here.
    "--attention-backend", "triton",
    # PyTorch sampling: no FlashInfer sampling JIT.
    "--sampling-backend", "pytorch",
    # No CUDA graphs: upstream's capture of MoE models takes minutes, longer than a test server should wait.
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    # Every request computed from scratch: repeated greedy requests and teacher-forced logprobs
    # are exactly comparable (a radix-cache hit would change the prefill shapes).
    "--disable-radix-cache",
    # A batched /generate reaches the scheduler as one message, so a repeated batch is prefilled
    # and decoded in the same batch shapes (sent request by request, two identical batches of
    # three prompts were prefilled as 1+2, then as 2+1): the repeat test then compares like with
    # like on stacks that are not batch-invariant.
    "--enable-tokenizer-batch-encode",
    # Small static memory and KV pool: several servers share one GPU.
    "--mem-fraction-static", "0.15",
    "--max-total-tokens", "65536",
    "--max-running-requests", "32",
    # The first forward may wait minutes on JIT compiles (Marlin, Triton, FlashInfer routing);
    # the default watchdog (300 s) would kill the server.
    "--watchdog-timeout", "1200",
    "--grammar-backend", "none",
    "--random-seed", "0",
]
ENV_SERVER_ARGS = "SGLANG_SM120_TEST_SERVER_ARGS"

# The served tiny models, "<arch>-<quant>" (built with seed 0).
TINY_MODELS = ["qwen3_moe-bf16", "qwen3_moe-nvfp4", "deepseek_v2-bf16", "deepseek_v2-nvfp4",
               "glm_moe_dsa-bf16", "glm_moe_dsa-nvfp4", "glm4_moe-bf16", "glm4_moe-nvfp4"]

DETERMINISTIC_FLAG = "--enable-deterministic-inference"
# Extra flags by model suffix. NVFP4 runs through Marlin on SM80-SM90, whose MoE reduces with
# atomic adds: identical greedy requests diverged on the H200 (first run) until deterministic
# inference turned that off (patch 0302).
# The DSA model's flags (dsa_flags) come last, so its attention backend wins over the default triton.
EXTRA_SERVER_ARGS = {"-nvfp4": [DETERMINISTIC_FLAG]}

# Beside other GPU jobs (SGLANG_SM120_GPU_MAX_TOKENS set): sglang sizes the KV pool from the
# memory still free minus (1 - fraction) x the GPU's total, so 0.15 would need 85% of the GPU
# free; a high fraction with the pool capped at the same 65536 tokens starts while others hold memory.
SHARED_GPU_MEM_FRACTION = "0.7"

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
    raw = settings.raw(ENV_DSA_ARGS)
    return shlex.split(raw) if raw is not None else list(DSA_SM90_FLAGS)


def dsa_env() -> dict:
    """Environment of a DSA server: the SM90 threshold unless upstream's defaults were asked for."""
    return dict(DSA_SM90_ENV) if settings.raw(ENV_DSA_ARGS) is None else {}


def server_args(model: str = "") -> List[str]:
    """The flags of a tiny model's server ("<arch>-<quant>"; "" for the flags every model gets)."""
    raw = settings.raw(ENV_SERVER_ARGS)
    base = shlex.split(raw) if raw is not None else list(DEFAULT_SERVER_ARGS)
    if raw is None and settings.integer("SGLANG_SM120_GPU_MAX_TOKENS"):
        base[base.index("--mem-fraction-static") + 1] = SHARED_GPU_MEM_FRACTION
    extra = [a for suffix, more in EXTRA_SERVER_ARGS.items() if model.endswith(suffix) for a in more]
    if model.startswith(DSA_ARCH + "-"):
        # sglang refuses --enable-deterministic-inference for DeepSeek-family models unless the
        # attention backend is fa3 or triton; server_env asks patch 0302 for the ordered reduce
        extra = [a for a in extra if a != DETERMINISTIC_FLAG] + dsa_flags()
    return base + extra


def server_env(model: str = "") -> dict:
    """Environment additions of a model's server: for the DSA model the prefill threshold and,
    in place of the refused flag, the fork's Marlin MoE ordered reduce (patch 0302; sglang resets
    SGLANG_ENABLE_DETERMINISTIC_INFERENCE to 0 whenever the flag is off, so that variable is no
    substitute)."""
    if not model.startswith(DSA_ARCH + "-"):
        return {}
    env = dsa_env()
    if any(DETERMINISTIC_FLAG in extra and model.endswith(suffix)
           for suffix, extra in EXTRA_SERVER_ARGS.items()):
        env["SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE"] = "1"
    return env


def tiny_model(root: Path, arch: str, quant: str) -> Path:
    """root/<arch>-<quant>, built by the factory (seed 0) unless it is there already."""
    out = Path(root) / f"{arch}-{quant}"
    if not (out / "config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "sglang.sm120.tiny", "--arch", arch, "--quant", quant, "--out", str(out)],
            check=True,
            timeout=1200,
        )
    return out
