"""Shared pytest setup: GPU/nvcc markers skip cleanly where the hardware or toolchain is absent."""
import importlib.metadata as md
import os
import shutil

import pytest


def _installed_fork_base():
    """The upstream base of the fork installed in this interpreter ('0.5.16' of 0.5.16+sm120.1)."""
    try:
        version = md.version("sglang")
    except md.PackageNotFoundError:
        return None
    return version.split("+", 1)[0] if "+sm120." in version else None


# Tests read the base they check from SGLANG_SM120_BASE (forkbuild.config.load_pin); unset, the
# installed fork's base, so a venv of either base tests itself without being told.
if not os.environ.get("SGLANG_SM120_BASE") and _installed_fork_base():
    os.environ["SGLANG_SM120_BASE"] = _installed_fork_base()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_gpu = _cuda_available()
    has_nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc"))
