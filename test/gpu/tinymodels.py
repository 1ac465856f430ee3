"""Tiny models for GPU tests, made on demand by the factory (`python -m sglang.sm120.tiny`)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Tensor-parallel size of the engines the layerwise GPU tests start (2 on a 2-GPU host: issue 7).
TP = int(os.environ.get("SGLANG_SM120_TP", "1"))


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
