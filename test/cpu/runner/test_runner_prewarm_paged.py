"""The paged KV allocator's Triton kernels are built before the traps arm.

With a page size above 1 (DSA serves with 64) the scheduler allocates KV through upstream's
`alloc_extend_kernel` / `alloc_decode_kernel`, whose batch bound is a constexpr: one kernel per
power of two of the batch size and per `last_loc` dtype. Unwarmed, the first batches after capture
compiled them (ptxas and gcc subprocesses caught by the traps on the H200). These tests run the
warm step with recording kernels on CPU tensors.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

A = pytest.importorskip("sglang.kernels.ops.memory.allocator")

from sglang.sm120.runner import prewarm  # noqa: E402


class Recorder:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        def launch(*args):
            self.calls.append((self.name, args))
        return launch


def _runner(page_size, max_running, row_dtype=torch.int32):
    return SimpleNamespace(
        token_to_kv_pool_allocator=SimpleNamespace(page_size=page_size),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(4, 8, dtype=row_dtype)),
        max_running_requests=max_running,
    )


@pytest.fixture
def calls(monkeypatch):
    calls = []
    monkeypatch.setattr(A, "alloc_extend_kernel", Recorder("extend", calls))
    monkeypatch.setattr(A, "alloc_decode_kernel", Recorder("decode", calls))
    return calls


def test_every_power_of_two_up_to_the_request_limit_and_both_last_loc_dtypes(calls):
    prewarm.warm_paged_allocator(_runner(page_size=64, max_running=1000))
    bounds = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    extend = [(a[5], a[2].dtype) for k, a in calls if k == "extend"]
    decode = [(a[4], a[1].dtype) for k, a in calls if k == "decode"]
    assert sorted(extend, key=str) == sorted([(b, d) for b in bounds for d in (torch.int32, torch.int64)], key=str)
    assert decode == [(b, torch.int32) for b in bounds]  # decode's last_loc is a req_to_token row
    assert all(a[-1] == 64 for _, a in calls)  # the page size is the other constexpr
    # the launch writes only scratch outputs sized for one request
    assert all(a[4].numel() == 64 for k, a in calls if k == "extend")


def test_page_size_one_builds_nothing(calls):
    prewarm.warm_paged_allocator(_runner(page_size=1, max_running=1024))
    assert calls == []


def test_bounds():
    assert prewarm.power_of_two_bounds(1) == [1]
    assert prewarm.power_of_two_bounds(3) == [1, 2, 4]
    assert prewarm.power_of_two_bounds(1024) == [1 << i for i in range(11)]


def test_upstream_kernels_take_the_batch_bound_and_page_size_as_constexpr():
    """The fact the warm step exists for (fails if upstream stops specialising on them)."""
    for kernel in ("alloc_extend_kernel", "alloc_decode_kernel"):
        src = inspect.getsource(getattr(A, kernel).fn)
        assert "bs_upper: tl.constexpr" in src and "page_size: tl.constexpr" in src
