"""deploy/prebuild_jit.py: every listed module names a real loader of the installed
sglang and its arguments bind to that loader (a renamed loader or a changed signature upstream
would otherwise only show as a compile on the GPU host)."""
import importlib
import inspect

import pytest
import repo_scripts


@pytest.fixture(scope="module")
def prebuild():
    return repo_scripts.load("deploy/prebuild_jit.py")


def test_every_module_binds_to_its_loader(prebuild):
    pytest.importorskip("sglang.jit_kernel.utils")
    for name, (module, loader, args) in prebuild.MODULES.items():
        fn = getattr(importlib.import_module(module), loader)
        target = inspect.unwrap(fn)
        inspect.signature(target).bind(*prebuild.loader_args(args))  # raises TypeError on a mismatch


def test_string_arguments_are_torch_attributes(prebuild):
    import torch

    assert prebuild.loader_args((True, 64, "bfloat16")) == (True, 64, torch.bfloat16)
