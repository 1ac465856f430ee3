"""Kernel launch options of sglang.sm120.kernels.ops without a GPU: each environment variable sets
the process-wide default through the settings registry, an explicit keyword argument wins."""
import inspect
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.base_independent

KNOBS = {"pdl": "SGLANG_SM120_PDL", "cluster": "SGLANG_SM120_W4A16_CLUSTER",
         "warps": "SGLANG_SM120_W4A16_WARPS", "kernel": "SGLANG_SM120_W4A16_KERNEL",
         "sync": "SGLANG_SM120_KERNEL_SYNC"}


def _defaults(**env):
    code = ("from sglang.sm120.kernels import ops; "
            "print(ops.PDL_DEFAULT, ops.CLUSTER_DEFAULT, ops.WARPS_DEFAULT, ops.KERNEL_DEFAULT, "
            "ops._SYNC_AFTER_LAUNCH, ops._WORKSPACE_BYTES)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SM120_") or k == "SGLANG_SM120_REQUIRE_INSTALLED"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=180)


def test_defaults_unset_and_from_the_environment():
    base = _defaults()
    assert base.returncode == 0, base.stderr
    assert base.stdout.split() == ["True", "False", "auto", "auto", "False", str((8 << 20) + (256 << 10))]
    env = _defaults(SGLANG_SM120_PDL="0", SGLANG_SM120_W4A16_CLUSTER="1", SGLANG_SM120_W4A16_WARPS="4",
                    SGLANG_SM120_W4A16_KERNEL="warpk", SGLANG_SM120_KERNEL_SYNC="1", SGLANG_SM120_WORKSPACE_MB="0.5")
    assert env.returncode == 0, env.stderr
    assert env.stdout.split() == ["False", "True", "4", "warpk", "True", str((1 << 19) + (256 << 10))]


@pytest.mark.parametrize("name, value", [("SGLANG_SM120_PDL", "on"), ("SGLANG_SM120_KERNEL_SYNC", "yes"),
                                         ("SGLANG_SM120_WORKSPACE_MB", "8M")])
def test_a_bad_value_stops_the_import_naming_the_variable(name, value):
    proc = _defaults(**{name: value})
    assert proc.returncode != 0 and f"{name}={value!r}: expected" in proc.stderr


def test_every_knob_is_a_keyword_of_the_public_ops_and_an_argument_wins():
    from sglang.sm120.kernels import ops

    gemm = inspect.signature(ops.gemm_w4a16).parameters
    for kw in KNOBS:
        assert gemm[kw].kind is inspect.Parameter.KEYWORD_ONLY and gemm[kw].default is None, kw
    for fn in (ops.gemm_w4a4, ops.quantize_nvfp4):
        assert inspect.signature(fn).parameters["sync"].default is None
    assert ops._sync_after(None) is ops._SYNC_AFTER_LAUNCH
    assert ops._sync_after(True) is True and ops._sync_after(False) is False
