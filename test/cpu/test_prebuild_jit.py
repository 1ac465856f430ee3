"""tools/gpu_host/prebuild_jit.py: every listed module names a real loader of the installed
sglang and its arguments bind to that loader (a renamed loader or a changed signature upstream
would otherwise only show as a compile on the GPU host)."""
import importlib
import importlib.util
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prebuild():
    spec = importlib.util.spec_from_file_location("prebuild_jit", REPO / "tools" / "gpu_host" / "prebuild_jit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_module_binds_to_its_loader(prebuild):
    pytest.importorskip("sglang.jit_kernel.utils")
    for name, (module, loader, args) in prebuild.MODULES.items():
        fn = getattr(importlib.import_module(module), loader)
        target = inspect.unwrap(fn)
        inspect.signature(target).bind(*prebuild.loader_args(args))  # raises TypeError on a mismatch


def test_string_arguments_are_torch_attributes(prebuild):
    import torch

    assert prebuild.loader_args((True, 64, "bfloat16")) == (True, 64, torch.bfloat16)
