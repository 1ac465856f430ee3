"""The installed fork wheel behaves as upstream sglang plus the fork's identity and flags.

Runs against the `sglang` installed in this interpreter. CI installs the fork wheel and sets
SGLANG_SM120_REQUIRE_INSTALLED=1, so there these tests cannot be skipped.
"""
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildenv import load_pin, series_dir
from forkbuild.patches import read_series

try:
    INSTALLED = md.version("sglang")
except md.PackageNotFoundError:
    INSTALLED = None

if INSTALLED is None and os.environ.get("SGLANG_SM120_REQUIRE_INSTALLED") != "1":
    pytest.skip("no sglang installed in this interpreter", allow_module_level=True)


def py(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd="/")


def test_installed_distribution_is_the_fork():
    assert INSTALLED == load_pin().fork_version
    proc = py("-c", "import sglang; print(sglang.__version__)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == load_pin().fork_version


def test_info_reports_base_series_and_kernels():
    proc = py("-m", "sglang.sm120", "info")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    pin = load_pin()
    assert info["version"] == pin.fork_version
    assert info["upstream"]["version"] == info["base"]["version"] == pin.version
    assert info["base"]["verified"] == pin.verified and info["base"]["series"] == f"patches/{pin.version}"
    assert info["upstream"]["sha256"] == pin.wheels[info["upstream"]["wheel"]]
    assert [p["name"] for p in info["series"]] == read_series(series_dir())
    assert all(p["subject"] for p in info["series"])
    assert set(info["kernels"]["archs"]) <= {"sm_90a", "sm_100a", "sm_120a"}
    assert bool(info["kernels"]["archs"]) == bool(info["kernels"]["kernels"])


def test_entry_points_are_upstreams():
    eps = {e.name: e.value for e in md.distribution("sglang").entry_points if e.group == "console_scripts"}
    assert eps == {"sglang": "sglang.cli.main:main", "killall_sglang": "sglang.cli.killall:main"}
    script = Path(sys.executable).parent / "sglang"
    assert script.exists() or shutil.which("sglang")
    proc = subprocess.run([str(script) if script.exists() else "sglang", "version"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert load_pin().fork_version in proc.stdout


def test_launch_server_help_lists_restored_flag():
    proc = py("-m", "sglang.launch_server", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--enable-piecewise-cuda-graph" in proc.stdout
    assert "--cuda-graph-backend-prefill" in proc.stdout


def test_restored_flag_selects_layerwise_and_says_so():
    code = (
        "import argparse, logging; logging.basicConfig(level=logging.WARNING)\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
        # Upstream's legacy spelling where the base still has it (0.5.16), else its replacement.
        "legacy = any('--disable-piecewise-cuda-graph' in a.option_strings for a in p._actions)\n"
        "off = ['--disable-piecewise-cuda-graph'] if legacy else ['--cuda-graph-backend-prefill', 'disabled']\n"
        "a = p.parse_args(['--model-path', 'm', '--enable-piecewise-cuda-graph'])\n"
        "b = p.parse_args(['--model-path', 'm'])\n"
        "c = p.parse_args(['--model-path', 'm', *off, '--enable-piecewise-cuda-graph'])\n"
        "d = p.parse_args(['--model-path', 'm', '--enable-piecewise-cuda-graph', *off])\n"
        "for n in (a, b, c, d): print(n.cuda_graph_backend_decode, n.cuda_graph_backend_prefill)\n"
    )
    proc = py("-c", code)
    assert proc.returncode == 0, proc.stderr
    rows = [ln.split() for ln in proc.stdout.splitlines()[-4:]]
    assert rows == [["layerwise", "layerwise"], ["None", "None"],
                    ["layerwise", "disabled"], ["layerwise", "disabled"]], proc.stdout
    assert ("--enable-piecewise-cuda-graph: selecting the Dynamo-free 'layerwise' CUDA graph "
            "backend for decode and prefill") in proc.stderr


def test_nvfp4_marlin_moe_runner_does_not_scale_twice():
    """Patch 0301: top-k already carries routed_scaling_factor for ModelOpt NVFP4 MoE, so the
    Marlin runner (SM80-SM90) must not multiply by it again; the layer keeps its config."""
    code = (
        "import warnings; warnings.filterwarnings('ignore')\n"
        "import sglang.srt.layers.moe.utils as U\n"
        "from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig\n"
        "from sglang.srt.layers.quantization import modelopt_quant as MQ\n"
        "U.get_flags().moe.runner_backend = U.MoeRunnerBackend.MARLIN\n"
        "for f in (2.5, None):\n"
        "    m = MQ.ModelOptNvFp4FusedMoEMethod.__new__(MQ.ModelOptNvFp4FusedMoEMethod)\n"
        "    m.create_moe_runner(None, MoeRunnerConfig(routed_scaling_factor=f))\n"
        "    print('RESULT', f, m.runner.config.routed_scaling_factor, m.moe_runner_config.routed_scaling_factor)\n"
    )
    proc = py("-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln.split()[1:] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert rows == [["2.5", "None", "2.5"], ["None", "None", "None"]], proc.stdout


MARLIN_REDUCE_PROBE = """
import warnings; warnings.filterwarnings('ignore')
import os, sys, torch
import sglang.srt.utils.custom_op as CO
CO.register_custom_op = lambda fn=None, **kw: fn if callable(fn) else (lambda f: f)  # the Python body
import importlib
import sglang.srt.layers.moe.fused_moe_triton as FMT
import sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe as FM

class Stop(Exception):
    pass

def first_gemm(*args, use_atomic_add, **kwargs):
    print('RESULT', use_atomic_add)
    raise Stop

M, K, N, E, topk = 2, 64, 64, 4, 2
ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
FMT.moe_align_block_size = lambda topk_ids, block, experts, **kw: (
    torch.zeros(16, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.tensor([16]))
torch.cuda.get_device_capability = lambda device=None: (9, 0)
for case in sys.argv[1:]:
    for name in ('SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE', 'SGLANG_ENABLE_DETERMINISTIC_INFERENCE'):
        os.environ.pop(name, None)
    if case != 'none':
        os.environ[case] = '1'
    importlib.reload(FM)  # the fork's setting is read at import
    FM.moe_wna16_marlin_gemm = first_gemm
    FM.get_scalar_type = lambda *a: None
    try:
        FM.fused_marlin_moe(
            torch.zeros(M, K, dtype=torch.bfloat16), torch.zeros(E, K // 16, 2 * N * 2, dtype=torch.int32),
            torch.zeros(E, N // 16, 2 * K, dtype=torch.int32), torch.ones(E, 4, 2 * N), torch.ones(E, 4, K),
            torch.zeros(M, E), torch.ones(M, topk), ids, w1_global_scale=torch.ones(E),
            w2_global_scale=torch.ones(E), workspace=torch.zeros(64, dtype=torch.int32), num_bits=4)
    except Stop:
        pass
"""


def test_marlin_moe_reduces_in_order_when_asked():
    """Patch 0302: on SM90 Marlin MoE reduces with atomic adds unless deterministic inference
    or the fork's SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE asks for the fixed-order reduce (the
    first Marlin GEMM's use_atomic_add, per case)."""
    cases = ["none", "SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"]
    proc = py("-c", MARLIN_REDUCE_PROBE, *cases)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert got == ["True", "False", "False"], proc.stdout
