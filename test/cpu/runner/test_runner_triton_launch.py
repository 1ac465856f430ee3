"""runner/triton_launch.py on CPU: a call's Triton launches resolved once, then relaunched as recorded.

The stand-in JIT function mimics what the module relies on in Triton 3.6: `jit[grid](*a, **kw)`
launches and returns the compiled kernel, `jit.device_caches[device][-1]` is the binder that maps
the call's arguments to the kernel's parameters (constexprs and defaults included, options such
as num_warps left out), and `compiled[grid](*params)` is the compiled kernel's own launcher.
The real path runs in test/gpu/test_lean_moe.py (torch.equal to upstream on real kernels).
"""
from __future__ import annotations

import logging

import pytest
import torch

from sglang.sm120.runner import triton_launch
from sglang.sm120.runner.triton_launch import ResolvedOnce

DEVICE = 0


class Compiled:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("direct", self.name, grid, args))


class FakeJit:
    """A kernel(x, y, n, BLOCK: constexpr = 16) launched as kernel[grid](..., num_warps=4)."""

    def __init__(self, log, name="toy"):
        self.log, self.name = log, name
        self.compiled = Compiled(log, name)
        self.device_caches = {DEVICE: (None, None, None, None, self._binder)}

    @staticmethod
    def _binder(x, y, n, BLOCK=16, **options):
        return {"x": x, "y": y, "n": n, "BLOCK": BLOCK}, ["spec"], options

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            params, _, _ = self._binder(*args, **kwargs)
            g = grid(params) if callable(grid) else grid
            self.log.append(("triton", self.name, tuple(g), tuple(params.values())))
            return self.compiled
        return run


class WithPreRunHook(FakeJit):
    """Triton runs a JIT function's pre_run_hooks before every launch: not replayable."""

    def __init__(self, log):
        super().__init__(log)
        self.pre_run_hooks = [lambda *a, **kw: None]


class NoBinder(FakeJit):
    """Like Triton's Autotuner / Heuristics wrappers: launchable, but no device_caches."""

    def __init__(self, log):
        super().__init__(log)
        del self.device_caches


toy = None  # the global the functions below launch through (set per test)
other = None


def launch_one(x, y, n):
    toy[lambda meta: (n // meta["BLOCK"],)](x, y, n, num_warps=4)


def launch_two(x, n):
    toy[(n, 2)](x, x, n, BLOCK=32)
    other[(1,)](x, x, 2 * n)


def launch_none():
    pass


def no_global():
    pass


@pytest.fixture
def log(monkeypatch):
    entries = []
    monkeypatch.setattr(triton_launch, "_logged", set())
    monkeypatch.setitem(globals(), "toy", FakeJit(entries))
    monkeypatch.setitem(globals(), "other", FakeJit(entries, "other"))
    return entries


def _call(fn, *args):
    from functools import partial
    return partial(fn, *args)


def test_first_call_through_triton_then_the_recorded_launch(log):
    call = ResolvedOnce(_call(launch_one, "X", "Y", 64), ["toy"], device=DEVICE)
    call()
    assert log == [("triton", "toy", (4,), ("X", "Y", 64, 16))]
    assert isinstance(globals()["toy"], FakeJit)  # the stand-in was put back
    log.clear()
    call()
    call()
    # the grid function evaluated once on the bound parameters, padded to three dimensions;
    # every parameter passed, the constexpr default included, the launch option not
    assert log == [("direct", "toy", (4, 1, 1), ("X", "Y", 64, 16))] * 2


def test_tensors_are_relaunched_as_their_addresses_and_kept_alive(log):
    x, y = torch.zeros(4), torch.ones(8)
    call = ResolvedOnce(_call(launch_one, x, y, 16), ["toy"], device=DEVICE)
    call()
    assert log[0][3][:2] == (x, y)  # Triton itself got the tensors
    log.clear()
    call()
    assert log == [("direct", "toy", (1, 1, 1), (x.data_ptr(), y.data_ptr(), 16, 16))]
    (launch,) = call.launches
    assert all(t is u for t, u in zip(launch._tensors, (x, y)))


def test_another_threads_launch_during_the_recording_is_not_recorded(log):
    import threading

    def with_a_foreign_launch():
        t = threading.Thread(target=lambda: toy[(7,)]("A", "B", 7))  # e.g. another worker's MoE
        t.start()
        t.join()
        toy[(2,)]("X", "Y", 2)

    call = ResolvedOnce(with_a_foreign_launch, ["toy"], device=DEVICE)
    call()
    assert [e[2] for e in log] == [(7,), (2,)]  # both launched, through Triton
    assert [launch.grid for launch in call.launches] == [(2, 1, 1)]  # only this call's is kept


def test_two_kernels_relaunched_in_their_order(log):
    call = ResolvedOnce(_call(launch_two, "X", 8), ["toy", "other"], device=DEVICE)
    call()
    assert [e[:2] for e in log] == [("triton", "toy"), ("triton", "other")]
    log.clear()
    call()
    assert log == [("direct", "toy", (8, 2, 1), ("X", "X", 8, 32)), ("direct", "other", (1, 1, 1), ("X", "X", 16, 16))]


@pytest.mark.parametrize("fn, args, names, why", [
    (launch_none, (), ["toy"], "launched none of ['toy']"),
    (no_global, (), ["missing_kernel"], "has no global missing_kernel"),
])
def test_nothing_to_record_keeps_the_call_as_it_is(log, caplog, fn, args, names, why):
    calls = []

    def counted():
        calls.append(1)
        fn(*args)

    call = ResolvedOnce(counted, names, device=DEVICE)
    with caplog.at_level(logging.INFO, logger=triton_launch.__name__):
        for _ in range(3):
            call()
    assert len(calls) == 3 and call.launches is None and why in call.uncached
    assert [r.getMessage() for r in caplog.records].count(
        f"lean eager MoE: Triton launches resolved per call ({call.uncached})") == 1


def test_a_kernel_without_a_binder_launches_through_triton_every_time(log, monkeypatch, caplog):
    monkeypatch.setitem(globals(), "toy", NoBinder(log))
    call = ResolvedOnce(_call(launch_one, "X", "Y", 32), ["toy"], device=DEVICE)
    with caplog.at_level(logging.INFO, logger=triton_launch.__name__):
        for _ in range(3):
            call()
    assert [e[0] for e in log] == ["triton"] * 3
    assert "device_caches" in call.uncached
    assert sum("resolved per call" in r.getMessage() for r in caplog.records) == 1


def test_a_kernel_with_pre_run_hooks_is_not_cached(log, monkeypatch):
    monkeypatch.setitem(globals(), "toy", WithPreRunHook(log))
    call = ResolvedOnce(_call(launch_one, "X", "Y", 32), ["toy"], device=DEVICE)
    call()
    call()
    assert [e[0] for e in log] == ["triton"] * 2 and "pre_run_hooks" in call.uncached


def test_an_error_in_the_call_puts_the_kernel_back(log):
    def boom():
        toy[(1,)]("X", "Y", 1)
        raise RuntimeError("kernel argument check")

    call = ResolvedOnce(boom, ["toy"], device=DEVICE)
    with pytest.raises(RuntimeError, match="argument check"):
        call()
    assert isinstance(globals()["toy"], FakeJit) and not isinstance(globals()["toy"], triton_launch._Recorder)
    assert call.launches is None and call.uncached is None  # not decided: the next call records again


def test_grid_of_more_than_three_dimensions_is_refused(log):
    def four_d():
        toy[(1, 1, 1, 1)]("X", "Y", 1)

    call = ResolvedOnce(four_d, ["toy"], device=DEVICE)
    call()
    assert call.launches is None and "1-3 dimensions" in call.uncached
    assert [e[0] for e in log] == ["triton"]  # the launch itself happened, through Triton
