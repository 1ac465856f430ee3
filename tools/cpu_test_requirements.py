#!/usr/bin/env python3
"""Requirements of the fork wheel for running the CPU test suite on a machine without a GPU.

Prints the wheel's own Requires-Dist lines (markers kept) minus the GPU kernel packages below,
for `pip install -r -` followed by `pip install --no-deps WHEEL`. Each skipped package ships
only CUDA kernels (or a compiler for them); none can do anything without a GPU, and the CPU
suite passes the same with or without them (285 passed / 75 skipped both ways on 2026-12-01).
Skipping them saves ~2.1 GB of the 9.1 GB test venv and ~0.7 GB of downloads, which is what a
disk-starved CI machine ran out of. torch stays the pinned CUDA build: sglang imports
torchvision at module level, and PyPI's torchvision only loads beside its own torch.

    python -m tools.cpu_test_requirements dist/sglang-*.whl   # one requirement a line (repo root)
"""
from __future__ import annotations

import sys
from pathlib import Path

from deploy.wheelhouse_lib.compat import Requirement, canonicalize_name
from deploy.wheelhouse_lib.wheelfile import read_metadata

GPU_ONLY = {
    "sglang-kernel": "sgl_kernel's CUDA ops (1.1 GB); its import needs libcuda.so.1",
    "flash-attn-4": "FlashAttention 4 CUDA kernels",
    "tokenspeed-mla": "MLA CUDA kernels (pulls tokenspeed-triton, 0.3 GB)",
    "tilelang": "GPU kernel DSL and compiler (0.2 GB)",
    "sgl-deep-gemm": "DeepGEMM FP8 CUDA kernels",
    "humming-kernels": "CUDA kernels",
    "quack-kernels": "CuTe-DSL CUDA kernels",
    "helion": "GPU kernel DSL (upstream imports it lazily and logs its absence)",
}


def req_name(req: str) -> str:
    """Canonical project name of a requirement line (PEP 503)."""
    return canonicalize_name(Requirement(req).name)


def requires_dist(wheel: str) -> list[str]:
    return read_metadata(Path(wheel))[2]


def cpu_test_requirements(reqs: list[str]) -> tuple[list[str], list[str]]:
    """(kept, skipped): requirements behind an `extra` marker are dropped too (never installed)."""
    kept, skipped = [], []
    for req in reqs:
        marker = Requirement(req).marker
        if marker is not None and "extra" in str(marker):
            continue
        (skipped if req_name(req) in GPU_ONLY else kept).append(req)
    return kept, skipped


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".whl"):
        print("usage: cpu_test_requirements.py WHEEL", file=sys.stderr)
        return 2
    kept, skipped = cpu_test_requirements(requires_dist(argv[0]))
    for req in skipped:
        print(f"[setup] CPU test env skips {req}: {GPU_ONLY[req_name(req)]}", file=sys.stderr)
    print("\n".join(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
