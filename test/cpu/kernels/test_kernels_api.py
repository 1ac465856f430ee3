"""The W4A16 warps option of sglang.sm120.kernels without a GPU: parsing and the env default."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[3]


def test_warps_accepts_4_and_8_only():
    from sglang.sm120.kernels import ops

    assert ops._warps(4, "warps") == 4 and ops._warps("8", "warps") == 8
    for bad in (6, 0, "eight", None, 16):
        with pytest.raises(ValueError, match="warps must be 4 or 8"):
            ops._warps(bad, "warps")
    assert ops._FLAG_EIGHT_WARPS == 4  # kW4A16EightWarps in csrc/kernels.h
    assert "kW4A16EightWarps = 4" in (REPO / "csrc" / "kernels.h").read_text()


def _import_with(env_value):
    env = dict(os.environ, SGLANG_SM120_W4A16_WARPS=env_value)
    return subprocess.run([sys.executable, "-c", "from sglang.sm120.kernels import ops; print(ops.WARPS_DEFAULT)"],
                          env=env, capture_output=True, text=True, timeout=120)


def test_env_sets_the_default_and_a_bad_value_names_the_variable():
    ok = _import_with("8")
    assert ok.returncode == 0 and ok.stdout.strip() == "8", ok.stderr
    auto = _import_with("auto")
    assert auto.returncode == 0 and auto.stdout.strip() == "auto", auto.stderr
    bad = _import_with("5")
    assert bad.returncode != 0 and "SGLANG_SM120_W4A16_WARPS='5': expected one of auto, 4, 8" in bad.stderr


def test_auto_warps_leave_the_choice_to_the_plan(monkeypatch):
    """"auto" sends kW4A16AutoWarps (the plan picks 4 or 8: test_kernel_build.py checks the rule), an
    explicit count its own flag (8: kW4A16EightWarps, 4: none)."""
    from sglang.sm120.kernels import ops

    assert ops._FLAG_AUTO_WARPS == 32 and "kW4A16AutoWarps = 32" in (REPO / "csrc" / "kernels.h").read_text()
    monkeypatch.setattr(ops, "WARPS_DEFAULT", "auto")
    assert ops._warps_flag(None) == ops._FLAG_AUTO_WARPS
    assert ops._warps_flag(4) == 0 and ops._warps_flag(8) == ops._FLAG_EIGHT_WARPS  # an explicit count wins
    monkeypatch.setattr(ops, "WARPS_DEFAULT", 4)
    assert ops._warps_flag(None) == 0
    with pytest.raises(ValueError, match="warps must be 4 or 8"):
        ops._warps_flag(6)


def test_kernel_option_names_the_kernels_and_matches_the_flags():
    from sglang.sm120.kernels import ops

    assert ops._kernel("warpk", "kernel") == "warpk" and ops._kernel("split", "kernel") == "split"
    for bad in ("fast", None, "WARPK", 8):
        with pytest.raises(ValueError, match="kernel must be one of"):
            ops._kernel(bad, "kernel")
    header = (REPO / "csrc" / "kernels.h").read_text()
    assert "kW4A16WarpK = 8" in header and "kW4A16SplitK = 16" in header
    assert (ops._FLAG_WARPK, ops._FLAG_SPLITK) == (8, 16)
    assert f"kW4A16WarpKMaxM = {ops.WARPK_MAX_M};" in header


def test_kernel_env_default_and_a_bad_value_names_the_variable():
    def run(value):
        env = dict(os.environ, SGLANG_SM120_W4A16_KERNEL=value)
        return subprocess.run([sys.executable, "-c", "from sglang.sm120.kernels import ops; print(ops.KERNEL_DEFAULT)"],
                              env=env, capture_output=True, text=True, timeout=120)

    ok = run("split")
    assert ok.returncode == 0 and ok.stdout.strip() == "split", ok.stderr
    bad = run("gemv")
    assert bad.returncode != 0 and "SGLANG_SM120_W4A16_KERNEL='gemv': expected one of" in bad.stderr
