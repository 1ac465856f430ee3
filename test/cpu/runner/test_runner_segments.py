"""Segmented capture on a toy MoE model, with the CPU graph emulator standing in for CUDA graphs.

The model mimics what the layerwise runner meets in sglang: an in-place fused add+RMSNorm that
writes into the MoE output buffer, a router whose top-k result is a NamedTuple, an MoE whose
forward starts with the same hook patch 0105 adds to FusedMoE.forward, an MoE that syncs with
the host (fine for an eager island, fatal inside a graph), and a per-forward Python flag the
MoE reads (like sglang's fuse_mlp_allreduce) that must be restored at replay.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import pytest
import torch

from sglang.sm120.runner import boundary
from sglang.sm120.runner.boundary import (
    BoundaryMismatch,
    CaptureSession,
    ProbeSession,
    StagingArena,
    boundary_active,
    cross,
)
from cpu_graph import HostSyncInCapture, RecordingGraph
from sglang.sm120.runner.layerwise import capture_size
from sglang.sm120.runner.segments import SegmentCapture, SegmentedGraph, StreamForkTracker

torch.manual_seed(0)

# A per-forward flag the MoE reads; the decoder layer sets it around the MLP call.
MOE_SCALE = contextvars.ContextVar("toy_moe_scale", default=1.0)


@contextlib.contextmanager
def moe_scale(value: float):
    token = MOE_SCALE.set(value)
    try:
        yield
    finally:
        MOE_SCALE.reset(token)


def moe_scale_provider():
    seen = MOE_SCALE.get()
    return lambda: moe_scale(seen)


class TopK(NamedTuple):
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    router_logits: torch.Tensor


class ToyMoE(torch.nn.Module):
    def __init__(self, hidden, n_experts, inter):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(n_experts, hidden, inter) * 0.2)
        self.w2 = torch.nn.Parameter(torch.randn(n_experts, inter, hidden) * 0.2)
        self.calls = 0

    def forward(self, hidden_states, topk_output):
        if boundary_active():  # the hook patch 0105 puts at the top of FusedMoE.forward
            return cross(self, hidden_states, topk_output)
        self.calls += 1
        weights, ids, _ = topk_output
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(ids).tolist():  # host sync: legal only because this runs eagerly
            rows, slot = (ids == e).nonzero(as_tuple=True)
            h = torch.relu(hidden_states[rows] @ self.w1[e]) @ self.w2[e]
            out.index_add_(0, rows, h * weights[rows, slot].unsqueeze(-1))
        return out * MOE_SCALE.get()


def rms_norm_(x, residual, weight):
    """sglang's fused_add_rmsnorm semantics: residual += x; x = norm(residual) * w, in place."""
    residual.add_(x)
    x.copy_(residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
    return x, residual


class ToyLayer(torch.nn.Module):
    def __init__(self, hidden, n_experts, topk, inter, scale):
        super().__init__()
        self.ln1 = torch.nn.Parameter(torch.ones(hidden))
        self.ln2 = torch.nn.Parameter(torch.ones(hidden))
        self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.gate = torch.nn.Linear(hidden, n_experts, bias=False)
        self.experts = ToyMoE(hidden, n_experts, inter)
        self.topk = topk
        self.scale = scale

    def forward(self, h, residual):
        if residual is None:
            residual = h.clone()
            h = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + 1e-6) * self.ln1
        else:
            h, residual = rms_norm_(h, residual, self.ln1)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        attn = self.o(torch.sigmoid(q * k) * v)  # per-token "attention" (no cross-row mixing)
        attn, residual = rms_norm_(attn, residual, self.ln2)
        logits = self.gate(attn)
        w, ids = torch.topk(torch.softmax(logits.float(), -1), self.topk, dim=-1)
        topk_out = TopK(w / w.sum(-1, keepdim=True), ids.to(torch.int32), logits)
        with moe_scale(self.scale):
            out = self.experts(attn, topk_out)
        return out, residual


class ToyModel(torch.nn.Module):
    def __init__(self, vocab=50, hidden=16, layers=3, n_experts=6, topk=2, inter=24):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(
            ToyLayer(hidden, n_experts, topk, inter, scale=0.5 + i) for i in range(layers)
        )
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        h, residual = self.embed(ids), None
        for layer in self.layers:
            h, residual = layer(h, residual)
        h, _ = rms_norm_(h, residual, self.norm)
        return self.head(h)


@pytest.fixture(autouse=True)
def _state_provider():
    boundary.register_state_provider(moe_scale_provider)
    yield
    boundary._STATE_PROVIDERS.remove(moe_scale_provider)


def _capture(model, static_ids, rows, arena):
    with torch.no_grad():
        return capture_size(
            lambda: model(static_ids[:rows]),
            arena=arena,
            warmups=1,
            graph_factory=RecordingGraph,
        )


def test_replay_matches_eager_with_new_inputs_and_two_sizes():
    model = ToyModel()
    max_rows = 9
    static_ids = torch.zeros(max_rows, dtype=torch.long)
    arena = StagingArena(max_rows, "cpu")
    static_ids.copy_(torch.randint(0, 50, (max_rows,)))
    big = _capture(model, static_ids, 9, arena)  # largest first, like the runner
    small = _capture(model, static_ids, 4, arena)
    # one segment per layer boundary + 1; one eager step per MoE
    assert big.islands == 3 and big.graph.num_segments == 4 and len(big.graph.steps) == 3
    assert small.graph.num_segments == 4
    for trial in range(3):
        ids = torch.randint(0, 50, (max_rows,))
        static_ids.copy_(ids)
        calls_before = [layer.experts.calls for layer in model.layers]
        with torch.no_grad():
            big.graph.replay()
        assert [layer.experts.calls for layer in model.layers] == [c + 1 for c in calls_before]
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(big.output, want, rtol=1e-5, atol=1e-5)
        static_ids[:4].copy_(ids[:4])
        with torch.no_grad():
            small.graph.replay()
        torch.testing.assert_close(small.output, want[:4], rtol=1e-5, atol=1e-5)
    # inputs are staged once per size (shared by all layers), outputs in a ring of two sets
    names = {k[0] for k in arena._buffers}
    assert names == {"in.0", "in.1", "in.2", "in.3", "out0.0", "out1.0"}


def test_state_snapshot_is_what_makes_replay_correct():
    model = ToyModel(layers=2)
    static_ids = torch.randint(0, 50, (5,))
    arena = StagingArena(5, "cpu")
    entry = _capture(model, static_ids, 5, arena)
    boundary._STATE_PROVIDERS.remove(moe_scale_provider)
    try:
        bare = _capture(model, static_ids, 5, StagingArena(5, "cpu"))
    finally:
        boundary._STATE_PROVIDERS.append(moe_scale_provider)
    ids = torch.randint(0, 50, (5,))
    static_ids.copy_(ids)
    with torch.no_grad():
        want = model(ids)
    with torch.no_grad():
        entry.graph.replay()
    torch.testing.assert_close(entry.output, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        bare.graph.replay()  # MoE runs with the default scale 1.0 instead of 0.5 / 1.5
    assert not torch.allclose(bare.output, want, rtol=1e-3, atol=1e-3)


def test_moe_inside_a_plain_graph_fails_on_host_sync():
    """The same toy MoE cannot be captured whole: this is what the eager island avoids."""
    model = ToyModel(layers=1)
    ids = torch.randint(0, 50, (4,))
    g = RecordingGraph()
    g.capture_begin()
    with pytest.raises(HostSyncInCapture):
        with torch.no_grad():
            model(ids)
    g.capture_end()


def test_capture_does_not_run_the_moe():
    model = ToyModel(layers=2)
    static_ids = torch.randint(0, 50, (3,))
    arena = StagingArena(3, "cpu")
    records = []
    with torch.no_grad(), ProbeSession(arena, records):
        model(static_ids)
    calls = [layer.experts.calls for layer in model.layers]
    graph = SegmentedGraph()
    with torch.no_grad(), SegmentCapture(graph, graph_factory=RecordingGraph) as cap, CaptureSession(
        arena, records, cap
    ):
        model(static_ids)
    assert [layer.experts.calls for layer in model.layers] == calls


def test_capture_rejects_a_forward_that_differs_from_warmup():
    model = ToyModel(layers=2)
    arena = StagingArena(6, "cpu")
    records = []
    with torch.no_grad(), ProbeSession(arena, records):
        model(torch.randint(0, 50, (6,)))
    graph = SegmentedGraph()
    with pytest.raises(BoundaryMismatch):
        with torch.no_grad(), SegmentCapture(graph, graph_factory=RecordingGraph) as cap, CaptureSession(
            arena, records, cap
        ):
            model(torch.randint(0, 50, (5,)))  # other row count than the probe
    assert boundary._SESSION is None


def test_session_closed_and_segment_ended_after_error():
    model = ToyModel(layers=1)
    arena = StagingArena(4, "cpu")
    ended = []

    class Graph(RecordingGraph):
        def capture_end(self):
            ended.append(self)
            super().capture_end()

    forwards = []

    def boom():  # the warmup forward works, the capture forward runs out of memory mid-way
        forwards.append(1)
        model.layers[0](model.embed(torch.zeros(4, dtype=torch.long)), None)
        if len(forwards) == 2:
            raise torch.OutOfMemoryError("simulated")
        return model(torch.zeros(4, dtype=torch.long))

    with pytest.raises(torch.OutOfMemoryError):
        with torch.no_grad():
            capture_size(boom, arena=arena, graph_factory=Graph)
    assert boundary._SESSION is None
    assert len(forwards) == 2
    assert len(ended) == 2 and all(g.captured for g in ended)  # no capture left open
    assert not boundary_active()


def test_replay_timed_accumulates_step_host_time():
    model = ToyModel(layers=2)
    static_ids = torch.randint(0, 50, (4,))
    entry = _capture(model, static_ids, 4, StagingArena(4, "cpu"))
    with torch.no_grad():
        entry.graph.replay_timed()
        entry.graph.replay_timed()
    assert entry.graph.timed_replays == 2 and entry.graph.step_host_seconds > 0
    assert 0 < entry.graph.step_cpu_seconds  # the thread's CPU time beside the wall time
    from sglang.sm120.runner.layerwise import host_step_stats

    ((key, wall, cpu, replays, attention),) = host_step_stats({4: entry})
    assert key == 4 and replays == 2 and wall == entry.graph.step_host_seconds / 4
    assert cpu == entry.graph.step_cpu_seconds / 4 and attention is None  # no attention islands


def test_a_step_that_waits_shows_as_wall_time_not_cpu_time():
    import time as _time

    graph = SegmentedGraph()
    graph.segments = [_NullSegment(), _NullSegment()]
    graph.steps = [lambda: _time.sleep(0.02)]
    graph.replay_timed()
    assert graph.step_host_seconds >= 0.02 and graph.step_cpu_seconds < 0.01


class _NullSegment:
    def replay(self):
        pass


class _Stream:
    def __init__(self, name):
        self.name = name


def test_fork_tracker_joins_and_reforks():
    cap, alt, other = _Stream("cap"), _Stream("alt"), _Stream("other")
    t = StreamForkTracker(lambda s: s is cap)
    t.on_wait(alt, cap)  # alt joins the capture
    t.on_wait(other, alt)  # unrelated
    assert t.pending() == [alt]
    t.on_wait(cap, alt)  # joined back
    assert t.pending() == []


def test_segment_capture_reforks_side_streams_after_a_cut():
    calls = []

    class S:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            calls.append((self.name, other.name))

    main, alt = S("main"), S("alt")
    graph = SegmentedGraph()
    cap = SegmentCapture(graph, graph_factory=RecordingGraph, stream=None)
    cap._capture_stream = lambda: main  # what the CUDA path gets from the capture stream
    cap._tracker = StreamForkTracker(lambda s: s is main)
    cap._begin()
    cap._tracker.on_wait(alt, main)  # model code forked alt into this segment
    cap.cut(lambda: None)
    assert calls == [("main", "alt"), ("alt", "main")]  # joined before the cut, re-forked after
    cap._end()
    assert graph.num_segments == 2


def test_replay_timed_profiles_the_eager_steps_when_asked(tmp_path, monkeypatch):
    from sglang.sm120.runner import segments

    out = tmp_path / "profile.txt"
    monkeypatch.setenv(segments.PROFILE_ENV, str(out))
    monkeypatch.setattr(segments, "_step_profiler", None)
    model = ToyModel(layers=2)
    static_ids = torch.randint(0, 50, (4,))
    entry = _capture(model, static_ids, 4, StagingArena(4, "cpu"))
    with torch.no_grad():
        entry.graph.replay_timed()
    prof = segments._step_profiler
    assert prof is not None
    segments._write_profile(prof, str(out))  # what atexit does
    text = out.read_text()
    assert "eager steps between layerwise segments" in text and "function calls" in text
