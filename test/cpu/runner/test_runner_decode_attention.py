"""Decode attention islands (boundary.cross_attention, runner/decode_attention.py, patch 0113).

A toy attention backend stands in for FlashInfer's: its result depends on the batch its metadata
was planned for (FlashInfer's decode plan sizes each request's KV split from the whole batch's
page counts, so another plan is another summation order; here a visible factor), and it writes
each row's k into its KV cache slot. A layerwise replay of a padded size with captured attention
runs the padded batch's plan and differs from the unpadded eager forward; with attention islands
the runner plans the real batch and the replay matches it, the KV going to the real slots only.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.sm120.runner import boundary, decode_attention
from sglang.sm120.runner.boundary import (BoundaryMismatch, ProbeSession, RecordingSession, StagingArena,
                                          attention_island_active, boundary_active, cross_attention)
from cpu_graph import RecordingGraph
from sglang.sm120.runner.layerwise import capture_size
from test_runner_real_rows import _state_provider  # noqa: F401 - autouse: MoE state, replay globals reset
from test_runner_segments import TopK, ToyMoE, rms_norm_

SLOTS = 64
PADDING_SLOT = 0  # where padded rows write their KV (sglang's KV pool keeps slot 0 for it)


class Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


class Batch:
    """What the toy backend reads of a ForwardBatch."""

    def __init__(self, rows: int, out_cache_loc: torch.Tensor, decode: bool = True):
        self.batch_size = rows
        self.out_cache_loc = out_cache_loc
        self.forward_mode = Mode(decode)


class FlashInferAttnBackend:
    """Toy of upstream's backend (named like it: decode_attention admits it by name)."""

    def __init__(self, hidden: int):
        self.plan = torch.zeros(())  # the planned batch size, read by the kernel (a graph reads it too)
        self.kv = torch.zeros(SLOTS, hidden)
        self.plans = []

    def init_forward_metadata(self, batch) -> None:
        self.plans.append(batch.batch_size)
        self.plan.fill_(batch.batch_size)

    def forward(self, q, k, v, layer, batch, save_kv_cache=True):
        if save_kv_cache:
            self.kv.index_copy_(0, batch.out_cache_loc, k)
        return torch.sigmoid(q * k) * v * (1.0 + 1e-3 * self.plan)


class ToyAttention(torch.nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.backend = backend

    def forward(self, q, k, v, forward_batch, save_kv_cache=True, **kwargs):
        if attention_island_active(forward_batch, kwargs):  # the hook patch 0113 adds
            return cross_attention(self, q, k, v, forward_batch, save_kv_cache)
        return self.backend.forward(q, k, v, self, forward_batch, save_kv_cache)


class Layer(torch.nn.Module):
    def __init__(self, backend, hidden=16, n_experts=6, topk=2, inter=24, moe=ToyMoE):
        super().__init__()
        self.ln = torch.nn.Parameter(torch.ones(hidden))
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.attn = ToyAttention(backend)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.gate = torch.nn.Linear(hidden, n_experts, bias=False)
        self.experts = moe(hidden, n_experts, inter)
        self.topk = topk

    def forward(self, h, residual, batch):
        h, residual = rms_norm_(h, residual, self.ln)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        h = self.o(self.attn(q.contiguous(), k.contiguous(), v.contiguous(), batch))
        logits = self.gate(h)
        w, ids = torch.topk(torch.softmax(logits.float(), -1), self.topk, dim=-1)
        return self.experts(h, TopK(w / w.sum(-1, keepdim=True), ids.to(torch.int32), logits)), residual


class Model(torch.nn.Module):
    def __init__(self, layers=2, hidden=16, vocab=50, moe=ToyMoE):
        super().__init__()
        self.backend = FlashInferAttnBackend(hidden)
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(Layer(self.backend, hidden, moe=moe) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids, batch):
        h = self.embed(ids)
        residual = torch.zeros_like(h)
        for layer in self.layers:
            h, residual = layer(h, residual, batch)
        return self.head(h + residual)


def real_batch(rows: int) -> Batch:
    return Batch(rows, torch.arange(10, 10 + rows))  # the requests' new KV slots


def _capture(model, static_ids, size, attention: bool):
    """As the runner captures a layerwise size: the dummy batch (every row writes the padding
    slot), its metadata planned for the padded size, the MoE on real rows."""
    captured = Batch(size, torch.full((size,), PADDING_SLOT))
    model.backend.init_forward_metadata(captured)
    with torch.no_grad():
        return capture_size(lambda: model(static_ids[:size], captured), arena=StagingArena(size, "cpu"),
                            warmups=1, graph_factory=RecordingGraph, real_rows=True, attention=attention)


def _replay(model, entry, rows, attention: bool):
    """As LayerwiseDecodeBackend replays: captured attention gets the padded size's plan, islands
    the real batch's (the runner's load_batch plans it)."""
    batch = real_batch(rows)
    model.backend.init_forward_metadata(batch if attention else Batch(entry.output.shape[0], None))
    previous = boundary.set_replaying_rows(rows), boundary.set_replaying_batch(batch if attention else None)
    try:
        with torch.no_grad():
            entry.graph.replay()
    finally:
        boundary.set_replaying_rows(previous[0])
        boundary.set_replaying_batch(previous[1])
    return entry.output[:rows]


@pytest.mark.parametrize("rows", [3, 8])
def test_islands_replay_the_unpadded_eager_forward_and_write_the_real_kv_slots(rows):
    torch.manual_seed(0)
    model = Model()
    static_ids = torch.randint(0, 50, (8,))
    islands = _capture(model, static_ids, 8, attention=True)
    captured = _capture(model, static_ids, 8, attention=False)
    # per layer: one attention island and one MoE island, in that order
    assert islands.islands == 4 and [getattr(s, "attention", False) for s in islands.graph.steps] == [True, False] * 2
    assert captured.islands == 2 and islands.attention and not captured.attention

    ids = torch.randint(0, 50, (8,))
    static_ids.copy_(ids)
    model.backend.kv.zero_()
    model.backend.init_forward_metadata(real_batch(rows))
    with torch.no_grad():
        want = model(ids[:rows], real_batch(rows))  # graphs disabled: the real batch, its own plan
    want_kv = model.backend.kv.clone()

    model.backend.kv.zero_()
    got = _replay(model, islands, rows, attention=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.backend.kv, want_kv, rtol=1e-6, atol=1e-6)
    assert (model.backend.kv[PADDING_SLOT] == 0).all()  # padded rows wrote no KV
    if rows < 8:  # the padded rows of each attention output are zero for the next segment
        assert all((s.out[rows:] == 0).all() for s in islands.graph.steps if getattr(s, "attention", False))
        got_captured = _replay(model, captured, rows, attention=False)
        assert not torch.allclose(got_captured, want, rtol=1e-4, atol=1e-4)  # the padded plan's factor


def test_each_island_kind_has_its_own_staging_and_output_ring():
    torch.manual_seed(1)
    model = Model(layers=3)
    static_ids = torch.randint(0, 50, (4,))
    arena = StagingArena(4, "cpu")
    captured = Batch(4, torch.full((4,), PADDING_SLOT))
    with torch.no_grad():
        entry = capture_size(lambda: model(static_ids, captured), arena=arena, warmups=1,
                             graph_factory=RecordingGraph, attention=True)
    names = {k[0] for k in arena._buffers}
    assert {"attn.in.0", "attn.in.1", "attn.in.2", "attn.out0.0", "attn.out1.0"} <= names
    assert {"in.0", "out0.0", "out1.0"} <= names
    outs = [s.out for s in entry.graph.steps if getattr(s, "attention", False)]
    assert outs[0].data_ptr() == outs[2].data_ptr() != outs[1].data_ptr()  # attention's ring of two


def test_a_replay_without_its_real_batch_or_with_more_requests_than_rows_is_refused():
    torch.manual_seed(2)
    model = Model(layers=1)
    static_ids = torch.randint(0, 50, (4,))
    entry = _capture(model, static_ids, 4, attention=True)
    with pytest.raises(BoundaryMismatch, match="without its real batch"), torch.no_grad():
        entry.graph.replay()
    boundary.set_replaying_batch(real_batch(5))
    with pytest.raises(BoundaryMismatch, match="5 requests"), torch.no_grad():
        entry.graph.replay()


def test_the_hook_diverts_only_plain_decode_calls_inside_an_attention_session():
    decode, extend = real_batch(2), Batch(2, torch.arange(2), decode=False)
    assert not attention_island_active(decode, {})  # no session
    arena = StagingArena(2, "cpu")
    with ProbeSession(arena, []):
        assert boundary_active() and not attention_island_active(decode, {})  # MoE islands only
    with RecordingSession():
        assert not attention_island_active(decode, {})
    with ProbeSession(arena, [], attention=True):
        assert attention_island_active(decode, {})
        assert not attention_island_active(extend, {})
        assert not attention_island_active(decode, {"sinks": torch.zeros(1)})  # extra arguments
        assert not attention_island_active(decode, {}, 7)  # 0.5.23: key_value_num_tokens set
        assert attention_island_active(decode, {}, None)
        token = boundary._BYPASS.set(True)  # the island's own eager call
        try:
            assert not attention_island_active(decode, {})
        finally:
            boundary._BYPASS.reset(token)
    assert boundary._SESSION is None


@pytest.mark.parametrize("case, reason", [
    ("flashinfer", None),
    ("fa3", None),
    ("in-graph", "records attention metadata inside the graph"),
    ("captured", "SGLANG_SM120_LAYERWISE_DECODE_ATTENTION=captured"),
    ("other", "the attention backend is TritonAttnBackend"),
    ("mla", "an MLA model"),
    ("split", "another attention backend"),
])
def test_only_flashinfer_mha_decode_gets_islands(monkeypatch, case, reason):
    if case == "captured":
        monkeypatch.setenv(decode_attention.ENV, "captured")
    in_graph = {"init_forward_metadata_in_graph": lambda self, fb: None}
    backend = {"other": lambda: type("TritonAttnBackend", (), {})(),
               "fa3": lambda: type("FlashAttentionBackend", (), in_graph)(),  # its in-graph step: spec only
               "in-graph": lambda: type("FlashInferAttnBackend", (), in_graph)(),
               }.get(case, lambda: FlashInferAttnBackend(4))()
    model_runner = SimpleNamespace(attn_backend=backend, use_mla_backend=case == "mla")
    runner_backend = FlashInferAttnBackend(4) if case == "split" else backend
    why = decode_attention.refusal(model_runner, runner_backend)
    assert (why is None) if reason is None else (reason in why)
    assert decode_attention.choose(model_runner, runner_backend) is (reason is None)


def test_a_malformed_setting_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(decode_attention.ENV, "sometimes")
    with pytest.raises(Exception, match=decode_attention.ENV):
        decode_attention.requested()


def test_timed_replays_count_attention_steps_apart_from_the_moe_steps():
    from sglang.sm120.runner.layerwise import host_step_stats

    torch.manual_seed(4)
    model = Model(layers=2)
    static_ids = torch.randint(0, 50, (4,))
    entry = _capture(model, static_ids, 4, attention=True)
    boundary.set_replaying_batch(real_batch(4))
    with torch.no_grad():
        entry.graph.replay_timed()
    ((key, moe, _cpu, replays, attention),) = host_step_stats({4: entry})
    g = entry.graph
    assert replays == 1 and g.attention_host_seconds > 0 and attention == g.attention_host_seconds / 2
    assert moe == g.step_host_seconds / 2  # per MoE step: the figure the benchmark's targets use
