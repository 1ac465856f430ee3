"""The extend batch's positions kernel is built before the traps arm.

ForwardBatch.init_new computes an extend batch's positions with upstream's Triton
`compute_position_kernel`; the runners' dummy batches never call it, so on a cold JIT cache the
server's own warm-up request compiled it after capture (ptxas, caught by the strict traps on the
H100, session 2026-12-05). The warm step launches it once per `has_prefix` (its only constexpr);
here with a recording kernel on CPU tensors.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

P = pytest.importorskip("sglang.kernels.ops.attention.position")

from sglang.sm120.runner import prewarm  # noqa: E402


class Recorder:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args))
        return launch


def _runner(backend):
    return SimpleNamespace(server_args=SimpleNamespace(attention_backend=backend), device="cpu")


def test_both_has_prefix_variants_are_launched(monkeypatch):
    calls = []
    monkeypatch.setattr(P, "compute_position_kernel", Recorder(calls))
    # 0.5.23 asks the platform, which on a CPU-only machine has no Triton
    monkeypatch.setattr("sglang.srt.utils.common.support_triton", lambda backend: backend == "flashinfer")
    prewarm.warm_extend_positions(_runner("flashinfer"))
    assert [args[-1] for _, args in calls] == [True, False]
    assert all(grid == (2,) for grid, _ in calls)


def test_a_backend_without_triton_positions_builds_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(P, "compute_position_kernel", Recorder(calls))
    monkeypatch.setattr("sglang.srt.utils.common.support_triton", lambda backend: False)
    prewarm.warm_extend_positions(_runner("some-backend"))
    assert calls == []


def test_the_warm_step_runs_before_the_traps_arm():
    import inspect

    from sglang.sm120.runner import startup

    src = inspect.getsource(startup.finish)
    assert src.index("warm_extend_positions(model_runner)") < src.index("traps.arm_from_env")


def test_the_decode_positions_kernel_is_built_per_seq_lens_dtype(monkeypatch):
    # ForwardBatch.init_new's decode positions: upstream's JIT clamp_position, one module per
    # dtype; the captured decode never builds a ForwardBatch, so on a cold cache the first real
    # decode ran ninja after the traps armed (H100, session 2026-12-05b)
    import torch

    F = pytest.importorskip("sglang.srt.model_executor.forward_batch_info")
    dtypes = []
    monkeypatch.setattr(F, "clamp_position", lambda seq_lens: dtypes.append(seq_lens.dtype))
    prewarm.warm_decode_positions(_runner("flashinfer"))
    assert dtypes == [torch.int32, torch.int64]


def test_the_decode_positions_warm_step_runs_before_the_traps_arm():
    import inspect

    from sglang.sm120.runner import startup

    src = inspect.getsource(startup.finish)
    assert src.index("warm_decode_positions(model_runner)") < src.index("traps.arm_from_env")
