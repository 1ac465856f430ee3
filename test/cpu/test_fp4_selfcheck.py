"""The sm120 backend's once-per-process self-check (sglang.sm120.fp4_selfcheck): its decision
logic with fakes, and the fallback through patch 0201 to upstream's path, without a GPU."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from installed import skip_module_without_sglang  # noqa: E402

skip_module_without_sglang()

from sglang.sm120 import fp4_selfcheck as S  # noqa: E402
from sglang.sm120.fp4_tolerance import compare  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_state():
    S.reset_for_tests()
    yield
    S.reset_for_tests()


def _outcome(ok, **kw):
    return S.Outcome(ok, kw.pop("n", 6144), kw.pop("k", 2048), 2048, S.CHECK_MS, 0.01, **kw)


def test_a_passing_check_runs_once_and_never_falls_back(caplog):
    calls, falls = [], []
    verify = lambda n, k, dev: calls.append((n, k, dev)) or _outcome(True, n=n, k=k)  # noqa: E731
    with caplog.at_level(logging.INFO, logger=S.__name__):
        assert S.ensure_verified(6144, 2048, "cuda:0", verify=verify, fall_back=falls.append).ok
        assert S.ensure_verified(512, 512, "cuda:0", verify=verify, fall_back=falls.append).ok
    assert calls == [(6144, 2048, "cuda:0")] and falls == []
    lines = [r for r in caplog.records if r.name == S.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "passed" in lines[0].getMessage()


def test_a_failing_check_falls_back_once_with_one_error_line_naming_shape_m_and_error(caplog):
    falls = []
    verify = lambda n, k, dev: _outcome(False, n=n, k=k, m=16, path="W4A16",  # noqa: E731
                                        error="1 of 98304 outside tolerance, rel err 1.2e-03")
    fall_back = lambda reason: falls.append(reason) or "flashinfer_cutlass"  # noqa: E731
    with caplog.at_level(logging.INFO, logger=S.__name__):
        res = S.ensure_verified(6144, 2048, "cuda:0", verify=verify, fall_back=fall_back)
        again = S.ensure_verified(6144, 2048, "cuda:0", verify=verify, fall_back=fall_back)
    assert not res.ok and again is res and res.fallback == "flashinfer_cutlass"
    assert len(falls) == 1 and "N=6144 K=2048 M=16" in falls[0]
    lines = [r for r in caplog.records if r.name == S.__name__]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR
    msg = lines[0].getMessage()
    for part in ("N=6144", "K=2048", "M=16", "W4A16", "outside tolerance", "flashinfer_cutlass"):
        assert part in msg, msg
    assert S.outcome() is res


def test_a_failed_check_without_a_possible_fallback_stops_instead_of_serving():
    verify = lambda n, k, dev: _outcome(False, n=n, k=k, m=1, path="W4A16", error="bad")  # noqa: E731

    def no_upstream(reason):
        raise ImportError("No module named 'sglang.srt'")

    with pytest.raises(RuntimeError, match=r"self-check FAILED \(N=6144 K=2048 M=1 W4A16: bad\).*sglang.srt"):
        S.ensure_verified(6144, 2048, "cuda:0", verify=verify, fall_back=no_upstream)


@pytest.mark.parametrize("raw,site", [(None, ""), ("", ""), ("gemm", "gemm"), (" GEMM ", "gemm")])
def test_fault_switch(env_value, raw, site):
    env_value(S.FAULT_INJECT_ENV, raw)
    assert S.fault_site() == site


def test_unknown_fault_is_refused(env_value):
    env_value(S.FAULT_INJECT_ENV, "quantize")
    with pytest.raises(ValueError, match=S.FAULT_INJECT_ENV):
        S.fault_site()


def test_the_injected_fault_breaks_the_tolerance_and_only_one_element():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4096, generator=g)
    w = torch.randn(256, 4096, generator=g) * 0.02
    ref, absref = x @ w.t(), x.abs() @ w.abs().t()
    y = ref.to(torch.bfloat16)
    assert compare(y, ref, absref).ok
    bad = compare(S.corrupt_one(y), ref, absref)
    assert not bad.ok and bad.bad == 1 and bad.first_bad == (0, 0)
    assert compare(y, ref, absref).ok  # corrupt_one left y alone


def test_checked_rows_bound_the_synthetic_weight():
    assert S.checked_rows(28672, 512) == 28672  # 14.7 M elements: all rows
    for n, k in [(24576, 6144), (6144, 16384), (16384, 2048)]:
        rows = S.checked_rows(n, k)
        assert rows % 128 == 0 and rows * k <= S.MAX_CHECK_ELEMENTS and rows < n
    assert S.checked_rows(4096, 1 << 20) == 128


FALLBACK_SCRIPT = textwrap.dedent(
    """
    import types, torch
    from sglang.srt.layers.quantization import fp4_utils
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4LinearMethod
    from sglang.sm120 import fp4_backend, fp4_layer, fp4_selfcheck, kernels

    kernels.available = lambda: True  # no library on a CPU box; the check is faked below
    repacked = []
    fp4_layer.repack = lambda layer: repacked.append(tuple(layer.weight.shape))

    def layer():
        m = torch.nn.Module()
        for name, value in dict(input_scale=torch.ones(1), weight_scale_2=torch.ones(1),
                                weight=torch.zeros(256, 64, dtype=torch.uint8),
                                weight_scale=torch.ones(256, 8).to(torch.float8_e4m3fn)).items():
            m.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
        return m

    method = ModelOptFp4LinearMethod.__new__(ModelOptFp4LinearMethod)
    method.quant_mode = "w4a4"  # what 0.5.23's __init__ sets for every backend but cutedsl W4A16
    # passing check: the layer is repacked for our kernels, the backend stays sm120
    fp4_selfcheck.verify_shape = lambda n, k, dev: fp4_selfcheck.Outcome(True, n, k, n, (1,), 0.0)
    fp4_backend.initialize_upstream_config("sm120")
    method.process_weights_after_loading(layer())
    assert repacked == [(256, 64)] and fp4_utils.get_fp4_gemm_runner_backend().is_sm120()

    # failing check (a fresh process state): upstream's auto choice, the layer goes down its path
    fp4_selfcheck.reset_for_tests()
    fp4_selfcheck.verify_shape = lambda n, k, dev: fp4_selfcheck.Outcome(
        False, n, k, n, (1,), 0.0, m=1, path="W4A16", error="injected")
    fp4_backend.initialize_upstream_config("sm120")
    try:
        method.process_weights_after_loading(layer())
    except ValueError as e:  # upstream's flashinfer path refuses a non-Blackwell device: it was reached
        assert "SM100" in str(e), e
    else:
        raise AssertionError("upstream's path was not taken")
    assert repacked == [(256, 64)], repacked  # the failing layer was not repacked
    backend = fp4_utils.get_fp4_gemm_runner_backend()
    assert not backend.is_sm120() and not backend.is_auto(), backend
    assert fp4_backend.auto_backend_choice() is None
    assert fp4_selfcheck.outcome().fallback == backend.value
    print("FALLBACK-OK", backend.value)
    """
)


def test_failed_check_hands_the_layer_and_the_process_to_upstream():
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd="/", env={**os.environ, "SGLANG_SM120_FAULT_INJECT": ""})
    assert proc.returncode == 0 and "FALLBACK-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "self-check FAILED" in proc.stderr and "N=256 K=128 M=1 W4A16: injected" in proc.stderr, proc.stderr[-3000:]
