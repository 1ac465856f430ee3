"""The DSA indexer's prefill key gather is built before the traps arm (base 0.5.16).

Upstream's `_get_k_and_s_triton` launches a Triton kernel whose `seq_len_num_pow` (the power of two
of the batch's request count) is a constexpr and whose page-table width is an int Triton
specialises (== 1, % 16): unwarmed, the first eager prefills after capture compile it (ptxas,
caught by the traps). These tests run the warm step through upstream's own wrapper with a
recording kernel on CPU tensors.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.sm120 import upstream_api
from sglang.sm120.runner import prewarm


class Recorder:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.calls.append((grid, kwargs))
        return launch


def _runner(max_running, page_size=64, head_dim=128):
    buf = torch.zeros(4, page_size * head_dim + page_size * 4, dtype=torch.uint8)
    pool = SimpleNamespace(index_k_with_scale_buffer=[buf, buf], page_size=page_size, index_head_dim=head_dim)
    return SimpleNamespace(token_to_kv_pool=pool, max_running_requests=max_running)


@pytest.fixture
def calls(monkeypatch):
    if not upstream_api.has("dsa_get_k_and_s_triton"):
        pytest.skip(upstream_api.ABSENT["dsa_get_k_and_s_triton"])
    mod = pytest.importorskip("sglang.kernels.ops.attention.dsa.index_buf_accessor")
    calls = []
    monkeypatch.setattr(mod, "_get_k_and_s_triton_kernel", Recorder(calls))
    return calls


def test_every_power_of_two_of_the_request_count_and_each_table_width_class(calls):
    prewarm.warm_dsa_index_gather(_runner(max_running=300))
    seen = {(kw["seq_len_num_pow"], kw["page_indice_batch_offset"]) for _, kw in calls}
    assert seen == {(p, w) for p in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) for w in (1, 16, 3)}
    assert len(calls) == 30
    for grid, kw in calls:
        assert kw["page_size"] == 64 and kw["index_head_dim"] == 128  # the pool's, the other constexprs
        assert kw["buf_numel_per_page"] == 64 * 128 + 64 * 4
        assert kw["page_indices_ptr"].dtype == torch.int32 and kw["seq_len_ptr"].dtype == torch.int64
        assert grid[1] == 1  # one token per request: one token block, page 0 only
        assert int(kw["page_indices_ptr"].max()) == 0


def test_a_pool_without_indexer_keys_builds_nothing(calls):
    runner = _runner(max_running=8)
    runner.token_to_kv_pool = SimpleNamespace(page_size=64)
    prewarm.warm_dsa_index_gather(runner)
    assert calls == []


def test_0_5_23_says_why_it_has_no_gather_to_build(monkeypatch, caplog):
    monkeypatch.setattr(upstream_api, "has", lambda name: name != "dsa_get_k_and_s_triton")
    with caplog.at_level("INFO"):
        prewarm.warm_dsa_index_gather(_runner(max_running=8))
    assert "DSA key gather not pre-built" in caplog.text and "index_key_cache" in caplog.text
