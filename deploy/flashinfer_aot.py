"""Pre-built FlashInfer attention modules for the models the GPU jobs serve, made without a GPU.

FlashInfer 0.6.14 compiles each attention variant with nvcc at first use (`JitSpec.build_and_load`):
on the H200 that is a minute or more per module inside the first prefill or capture (the
2026-11-29 runner benchmark spent 66 s before its first MoE call). A module found at
`flashinfer/data/aot/<name>/<name>.so` is loaded as is instead (`JitSpec.is_aot`), so modules
built here and copied there (`install_jitcache.sh`) take the compile off the host.

Which modules: what sglang's FlashInfer backends plan for these shapes (bf16, int32 indptr, no
RoPE in the kernel, no sliding window, no soft cap, no fp16 QK reduction):
  GQA (flashinfer_backend.py): paged prefill `fa2`; decode through that same fa2 prefill module
  when heads / kv_heads >= 4 (tensor cores), else the batch decode module; ragged prefill `auto`,
  which is fa3 on sm_90a and fa2 elsewhere.
  MLA (flashinfer_mla_backend.py): BatchMLAPagedAttention `auto` (fa3 on sm_90a, else fa2) with
  head_dim_ckv = kv_lora_rank, head_dim_kpe = qk_rope_head_dim; ragged prefill as above with
  head_dim_qk = qk_nope + qk_rope, head_dim_vo = v_head_dim.
  Sampling: the top-k/top-p module (runner/prewarm.py builds it before capture).
The names come from FlashInfer's own generators (`flashinfer.jit.gen_*`), so they are the ones
it looks up; a module not pre-built is compiled on the host as before.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple


def model_attention_shapes() -> Dict[str, dict]:
    """Attention shapes of the tiny test models and the Qwen3-30B-A3B-shaped benchmark model."""
    from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG as Q
    from sglang.sm120.tiny.spec import default_spec

    qwen = default_spec("qwen3_moe")
    ds = default_spec("deepseek_v2")
    glm4 = default_spec("glm4_moe")
    # tiny glm_moe_dsa has none: its attention is the DSA backend (FlashMLA + DeepGEMM), not FlashInfer
    return {
        "tiny qwen3_moe": {"kind": "gqa", "heads": qwen.heads, "kv_heads": qwen.kv_heads, "head_dim": qwen.head_dim},
        "tiny glm4_moe": {"kind": "gqa", "heads": glm4.heads, "kv_heads": glm4.kv_heads, "head_dim": glm4.head_dim},
        "tiny deepseek_v2": {"kind": "mla", "kv_lora_rank": ds.kv_lora_rank, "qk_rope": ds.qk_rope_head_dim,
                             "qk_nope": ds.qk_nope_head_dim, "v_head": ds.v_head_dim},
        "qwen3-30b-a3b shapes": {"kind": "gqa", "heads": Q["num_attention_heads"],
                                 "kv_heads": Q["num_key_value_heads"], "head_dim": Q["head_dim"]},
    }


def module_plan(arch: str, models: Optional[List[str]] = None) -> List[Tuple[str, str, tuple]]:
    """[(why, generator, args)] without duplicates, for a FlashInfer arch such as 9.0a; a
    generator is a function of flashinfer.jit (or of a submodule: `sampling.gen_...`). models:
    only the attention of the models whose name contains one of these strings (None: all)."""
    import torch

    bf16, i32 = torch.bfloat16, torch.int32
    ragged = "fa3" if arch == "9.0a" else "fa2"
    plan: List[Tuple[str, str, tuple]] = []

    def prefill(backend, qk, vo):
        return (backend, bf16, bf16, bf16, i32, qk, vo, 0, False, False, False)

    shapes = model_attention_shapes()
    if models is not None:
        unknown = [m for m in models if not any(m in name for name in shapes)]
        if unknown:
            raise ValueError(f"no model matches {unknown}; known: {sorted(shapes)}")
        shapes = {name: s for name, s in shapes.items() if any(m in name for m in models)}
    for model, s in shapes.items():
        if s["kind"] == "gqa":
            d = s["head_dim"]
            plan.append((f"{model}: paged prefill + tensor-core decode", "gen_batch_prefill_module", prefill("fa2", d, d)))
            if s["heads"] // s["kv_heads"] < 4:
                plan.append((f"{model}: decode", "gen_batch_decode_module", (bf16, bf16, bf16, i32, d, d, 0, False, False)))
            plan.append((f"{model}: ragged prefill", "gen_batch_prefill_module", prefill(ragged, d, d)))
        else:
            plan.append((f"{model}: MLA paged attention", "gen_batch_mla_module",
                         (ragged, bf16, bf16, bf16, i32, s["kv_lora_rank"], s["qk_rope"], False)))
            plan.append((f"{model}: ragged prefill", "gen_batch_prefill_module",
                         prefill(ragged, s["qk_nope"] + s["qk_rope"], s["v_head"])))
    plan.append(("sampling (top-k / top-p)", "sampling.gen_sampling_module", ()))
    # compiled on the H200 by the 2026-12-01 jobs although not attention: merge of attention states
    # (cascade) and FlashInfer's RMSNorm (norm)
    plan.append(("attention-state merge", "cascade.gen_cascade_module", ()))
    plan.append(("RMSNorm", "norm.gen_norm_module", ()))
    seen, out = set(), []
    for why, gen, args in plan:
        if (gen, args) not in seen:
            seen.add((gen, args))
            out.append((why, gen, args))
    return out


def generator(name: str):
    """flashinfer.jit.<name> (`sampling.gen_sampling_module` -> flashinfer.jit.sampling.gen_...)."""
    import importlib

    mod, _, fn = f"flashinfer.jit.{name}".rpartition(".")
    return getattr(importlib.import_module(mod), fn)


def driver_stub(cuda_home: str, work: Path) -> Path:
    """A libcuda.so exporting every driver entry point of cuda.h as an empty function.

    FlashInfer links its modules with -lcuda; a machine without a GPU driver (and a toolkit without
    stubs/) has no libcuda.so to link against. Only the link uses it: at run time the module binds
    to the host's real libcuda.so.1 (the stub's soname).
    """
    work.mkdir(parents=True, exist_ok=True)
    pre = subprocess.run(["gcc", "-E", "-x", "c", "-I", os.path.join(cuda_home, "include"), "-"],
                         input="#include <cuda.h>\n", capture_output=True, text=True, check=True).stdout
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", pre)))
    src = work / "libcuda_stub.c"
    src.write_text("".join(f"void {n}(void) {{}}\n" for n in names))
    lib = work / "libcuda.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)], check=True)
    return work


# (header that marks the family, the family's files): toolkit headers FlashInfer modules include
# that a minimal CUDA install lacks; torch's pip wheels (nvidia-curand, nvidia-cublas) ship them.
# fa3 prefill includes CUTLASS utilities that include curand_kernel.h; norm includes cublasLt.h.
PIP_HEADER_FAMILIES = (("curand_kernel.h", "curand*.h"), ("cublasLt.h", "cublas*.h"))


def missing_toolkit_headers(cuda_home: str, work: Path) -> Path | None:
    """An include folder with links to the header families of PIP_HEADER_FAMILIES that the
    toolkit at cuda_home lacks (the build machine's: a minimal CUDA install), taken from the pip
    nvidia-* wheels; None when it lacks none. Only those families are linked, so no other toolkit
    header can be shadowed."""
    import importlib.util

    missing = [(probe, pattern) for probe, pattern in PIP_HEADER_FAMILIES
               if not (Path(cuda_home) / "include" / probe).exists()]
    if not missing:
        return None
    roots = list(importlib.util.find_spec("nvidia").submodule_search_locations or [])
    for probe, pattern in missing:
        inc = next((i for r in roots for i in sorted(Path(r).glob("*/include")) if (i / probe).exists()), None)
        if inc is None:
            raise RuntimeError(f"{probe} is neither in {cuda_home}/include nor in a pip nvidia-* wheel "
                               "(pip install nvidia-curand nvidia-cublas)")
        work.mkdir(parents=True, exist_ok=True)
        for h in inc.glob(pattern):
            (work / h.name).unlink(missing_ok=True)
            (work / h.name).symlink_to(h)
    return work


def build(arch: str, out: Path, log: Callable[[str], None] = print, models: Optional[List[str]] = None) -> dict:
    """Build every planned module for `arch` into out/<name>/<name>.so; returns the manifest."""
    if "flashinfer" in sys.modules:
        raise RuntimeError("flashinfer was imported before its target arch was set: build() must import it first")
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    # Absolute: the paths below end up in build.ninja files that ninja runs from their own folder
    # (a relative --out made the link step miss the driver stub).
    out = Path(out).resolve()
    work = out / ".build"
    stub = driver_stub(cuda_home, work / "stub")
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(work)
    os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
    extra_inc = missing_toolkit_headers(cuda_home, work / "include")
    if extra_inc is not None:
        os.environ["FLASHINFER_EXTRA_CUDAFLAGS"] = f"-I{extra_inc}"
        os.environ["FLASHINFER_EXTRA_CFLAGS"] = f"-I{extra_inc}"
        for h in sorted(extra_inc.iterdir()):
            if h.name in {probe for probe, _ in PIP_HEADER_FAMILIES}:
                log(f"[flashinfer_aot] {h.name} and its family from {os.path.dirname(os.path.realpath(h))}")
    import flashinfer
    import tvm_ffi

    manifest = {"flashinfer": flashinfer.__version__, "arch": arch, "modules": []}
    plan = module_plan(arch, models)
    for i, (why, gen, args) in enumerate(plan, 1):
        spec = generator(gen)(*args)
        t = time.time()
        log(f"[flashinfer_aot] {i}/{len(plan)} {spec.name} ({why}) ...")
        spec.build(verbose=False)
        dest = out / spec.name / f"{spec.name}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, dest)
        tvm_ffi.load_module(str(dest))  # loads without a GPU: unresolved symbols fail here, not on the host
        secs = round(time.time() - t, 1)
        log(f"[flashinfer_aot] {spec.name}: {secs} s, {dest.stat().st_size / 2**20:.1f} MB")
        manifest["modules"].append({"name": spec.name, "why": why, "generator": gen,
                                    "args": [str(a) for a in args], "build_s": secs, "bytes": dest.stat().st_size})
    shutil.rmtree(work)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest
