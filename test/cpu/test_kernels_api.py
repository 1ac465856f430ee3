"""The W4A16 warps option of sglang.sm120.kernels without a GPU: parsing and the env default."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_warps_accepts_4_and_8_only():
    from sglang.sm120.kernels import ops

    assert ops._warps(4, "warps") == 4 and ops._warps("8", "warps") == 8
    for bad in (6, 0, "eight", None, 16):
        with pytest.raises(ValueError, match="warps must be 4 or 8"):
            ops._warps(bad, "warps")
    assert ops._FLAG_EIGHT_WARPS == 4  # kW4A16EightWarps in csrc/kernels.h
    assert "kW4A16EightWarps = 4" in (REPO / "csrc" / "kernels.h").read_text()


def _import_with(env_value):
    env = dict(os.environ, SGLANG_SM120_W4A16_WARPS=env_value,
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), *sys.path]))
    return subprocess.run([sys.executable, "-c", "from sglang.sm120.kernels import ops; print(ops.WARPS_DEFAULT)"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_env_sets_the_default_and_a_bad_value_names_the_variable():
    ok = _import_with("8")
    assert ok.returncode == 0 and ok.stdout.strip() == "8", ok.stderr
    auto = _import_with("auto")
    assert auto.returncode == 0 and auto.stdout.strip() == "auto", auto.stderr
    bad = _import_with("5")
    assert bad.returncode != 0 and "SGLANG_SM120_W4A16_WARPS must be 4, 8 or auto" in bad.stderr


def test_auto_warps_split_at_the_kernels_large_weight_threshold(monkeypatch):
    from sglang.sm120.kernels import ops

    # the same constant as the split-K rule's in csrc/kernels.h
    assert f"kW4A16LargeWeightBytes = {ops.W4A16_LARGE_WEIGHT_BYTES}" in (REPO / "csrc" / "kernels.h").read_text()
    monkeypatch.setattr(ops, "WARPS_DEFAULT", "auto")
    assert ops.w4a16_warps(640, 2048) == 8  # qwen3 qkv tp8: 0.74 MB packed + scales
    assert ops.w4a16_warps(6144, 2048) == 8  # glm5 o_proj tp8: 7.08 MB
    assert ops.w4a16_warps(6144, 4096) == 4  # glm5 o_proj tp4: 14.2 MB
    # K = 2048: 1152 bytes per row, so 6944 rows are 7,999,488 bytes (8 warps) and 6960 8,017,920 (4)
    assert ops.w4a16_warps(6944, 2048) == 8 and ops.w4a16_warps(6960, 2048) == 4
    assert ops.w4a16_warps(6144, 2048, 4) == 4 and ops.w4a16_warps(16384, 2048, 8) == 8  # explicit wins
    monkeypatch.setattr(ops, "WARPS_DEFAULT", 4)
    assert ops.w4a16_warps(640, 2048) == 4
    with pytest.raises(ValueError, match="warps must be 4 or 8"):
        ops.w4a16_warps(640, 2048, 6)
