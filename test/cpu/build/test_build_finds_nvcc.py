"""The wheel build looks for nvcc where the kernel build does (CUDA_HOME, /usr/local/cuda, PATH),
so a GPU host with the toolkit in /usr/local/cuda and no nvcc on PATH builds the kernels."""
import os
from pathlib import Path

import pytest

from forkbuild import build

pytestmark = pytest.mark.base_independent


def test_toolkit_in_usr_local_cuda_without_nvcc_on_path(monkeypatch):
    if not Path("/usr/local/cuda/bin/nvcc").is_file():
        pytest.skip("no CUDA toolkit in /usr/local/cuda")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("SGLANG_SM120_KERNELS", raising=False)
    assert build.kernels_wanted()


def test_forced_kernels_without_any_nvcc_fail(monkeypatch, tmp_path):
    monkeypatch.setattr("forkbuild.kernels.find_nvcc", lambda: None)
    monkeypatch.setenv("SGLANG_SM120_KERNELS", "1")
    with pytest.raises(build.BuildError, match="no nvcc"):
        build.kernels_wanted()
    monkeypatch.setenv("SGLANG_SM120_KERNELS", "auto")
    assert not build.kernels_wanted()


def test_an_explicit_cuda_home_without_nvcc_is_not_overridden(monkeypatch, tmp_path):
    from forkbuild import kernels

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    assert kernels.find_nvcc() is None
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert kernels.find_nvcc() == str(nvcc)
