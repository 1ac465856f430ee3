#!/usr/bin/env python3
"""Pre-build upstream sglang's JIT CUDA modules for a GPU architecture, on a machine without a GPU.

Upstream 0.5.16 compiles some kernels with nvcc at first use (sglang.jit_kernel via tvm-ffi). On
SM90 the NVFP4 path runs through Marlin, whose single translation unit takes ~6 minutes to
compile (measured on this project's 2-core build machine: gptq_marlin 350 s), so a fresh GPU host
spends its first NVFP4 forward compiling. The cache is keyed on module sources, architecture and
tvm-ffi version, so a folder built here is reused as is on the host:

    python deploy/prebuild_jit.py --arch 9.0a --out .jitcache     # here (needs nvcc + the fork installed)
    TVM_FFI_CACHE_DIR=$PWD/.jitcache python -m sglang.launch_server ...   # there

With --flashinfer it also pre-builds the FlashInfer attention and sampling modules of the GPU
jobs' models into .jitcache/flashinfer-aot/ (flashinfer_aot.py says which and why);
deploy/install_jitcache.sh puts both where the host looks for them.

Run it with the interpreter that has the fork (or upstream sglang) installed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# (module, loader, arguments): a string argument names a torch attribute (a dtype), anything else
# is passed as is. The first three are the NVFP4 (ModelOpt) path on SM80-SM90: linear layers and
# MoE through Marlin (minutes each). The others are what the H200 compiled itself during the
# 2026-12-01 jobs (tiny qwen3_moe / deepseek_v2, Qwen3-30B shapes; git tag records-archive: lab/archive/gpu-logs/2026-12-01-s4-jit-caches-after.txt),
# seconds each but on the critical path of every server start.
MODULES = {
    "gptq_marlin_repack": ("sglang.jit_kernel.gptq_marlin_repack", "_jit_gptq_marlin_repack_module", ()),
    "gptq_marlin_bf16": ("sglang.jit_kernel.gptq_marlin", "_jit_gptq_marlin_module", ("bfloat16",)),
    "moe_wna16_marlin_bf16": ("sglang.jit_kernel.moe_wna16_marlin", "_jit_moe_wna16_marlin_module", ("bfloat16",)),
    "activation_bf16": ("sglang.jit_kernel.activation", "_jit_activation_module", ("bfloat16",)),
    "clamp_position_int64": ("sglang.jit_kernel.clamp_position", "_jit_clamp_position_module", ("int64",)),
    "fused_rope_neox_128_bf16": ("sglang.jit_kernel.rope", "_jit_fused_rope_module", (True, 128, "bfloat16")),
    "fused_rope_neox_64_bf16": ("sglang.jit_kernel.rope", "_jit_fused_rope_module", (True, 64, "bfloat16")),
    "fused_rope_gptj_64_bf16": ("sglang.jit_kernel.rope", "_jit_fused_rope_module", (False, 64, "bfloat16")),
    "qknorm_128_bf16": ("sglang.jit_kernel.norm", "_jit_qknorm_module", (128, "bfloat16")),
    "qknorm_64_bf16": ("sglang.jit_kernel.norm", "_jit_qknorm_module", (64, "bfloat16")),
    # tiny deepseek_v2 (MLA): fused q_a + kv_a projection and the KV-buffer store
    "dsv3_fused_a_gemm_256_832": ("sglang.jit_kernel.dsv3_fused_a_gemm", "_jit_dsv3_fused_a_gemm_module", (256, 832, True)),
    "set_mla_kv_buffer_1024_128": ("sglang.jit_kernel.set_mla_kv_buffer", "_jit_set_mla_kv_buffer_module", (1024, 128, True)),
    # tiny glm_moe_dsa (GLM-5's DSA indexer): Hadamard rotation of the indexer's q and k, and the
    # fused FP8 store of the indexer key cache (key bf16, int64 cache locations, DSA page size 64).
    # Its rope (neox, 64 of 128 dims) and MLA modules are the ones above; glm4_moe's partial rope
    # (neox, 64 of 128) too. DeepGEMM's FP8 MQA-logits kernels JIT-compile in DeepGEMM's own cache
    # (not tvm-ffi's) and are not covered here.
    "hadamard_bf16": ("sglang.jit_kernel.hadamard", "_jit_hadamard_module", ("bfloat16",)),
    "dsa_fused_store_bf16_int64_64": ("sglang.jit_kernel.fused_store_index_cache", "_jit_dsa_fused_store_module",
                                      ("bfloat16", "int64", 64)),
}


def loader_args(args):
    import torch

    return tuple(getattr(torch, a) if isinstance(a, str) else a for a in args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="9.0a", help="compute capability with suffix, e.g. 9.0a or 12.0f")
    ap.add_argument("--out", required=True, help="cache folder (becomes TVM_FFI_CACHE_DIR on the host)")
    ap.add_argument("--modules", nargs="*", choices=sorted(MODULES), default=sorted(MODULES),
                    help="sglang JIT modules (none: only --flashinfer)")
    ap.add_argument("--flashinfer", action="store_true",
                    help="also pre-build FlashInfer's attention/sampling modules into OUT/flashinfer-aot")
    ap.add_argument("--flashinfer-models", nargs="+", metavar="NAME",
                    help="with --flashinfer: only these models' attention (a part of the name, e.g. "
                         "'tiny qwen3_moe'; sampling, merge and RMSNorm are always built)")
    a = ap.parse_args(argv)
    try:
        major, rest = a.arch.split(".")
        minor, suffix = rest[0], rest[1:]
        major, minor = int(major), int(minor)
    except ValueError:
        print(f"error: --arch {a.arch!r}: expected MAJOR.MINOR[suffix], e.g. 9.0a", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    os.environ["TVM_FFI_CACHE_DIR"] = os.path.abspath(a.out)
    # tvm-ffi derives the CUDA root from the nvcc on PATH; where that is a wrapper script
    # (/usr/local/bin/nvcc on the build machine) the link step looks for libcudart in /usr/local.
    if "CUDA_HOME" not in os.environ and os.path.isdir("/usr/local/cuda"):
        os.environ["CUDA_HOME"] = "/usr/local/cuda"
        print("[prebuild_jit] CUDA_HOME=/usr/local/cuda", flush=True)
    start = time.time()
    if a.flashinfer:  # first: FlashInfer reads its target arch when it is imported
        import flashinfer_aot  # beside this script, which runs as `python deploy/prebuild_jit.py`

        m = flashinfer_aot.build(a.arch, Path(a.out) / "flashinfer-aot",
                                 log=lambda msg: print(msg, flush=True), models=a.flashinfer_models)
        print(f"[prebuild_jit] FlashInfer: {len(m['modules'])} modules for {a.arch} in {time.time() - start:.0f} s",
              flush=True)
    import importlib

    from sglang.jit_kernel.utils.arch import override_jit_cuda_arch

    with override_jit_cuda_arch(major, minor, suffix):
        for name in a.modules:
            mod, fn, args = MODULES[name]
            t = time.time()
            print(f"[prebuild_jit] {name} for sm_{major}{minor}{suffix} ...", flush=True)
            getattr(importlib.import_module(mod), fn)(*loader_args(args))
            print(f"[prebuild_jit] {name}: {time.time() - t:.0f} s", flush=True)
    print(f"[prebuild_jit] done in {time.time() - start:.0f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
