"""LayerwiseDecodeBackend (real code, upstream's FullCudaGraphBackend underneath) driven on CPU.

The CPU graph emulator stands in for torch.cuda.CUDAGraph, a fake device module for
torch.cuda, and a toy MoE model for the decoder. Checks: full graphs below the ceiling and
layerwise segments above it replay what eager computes; an MoE that cannot live in a graph (it
syncs with the host) turns every size layerwise; an OOM drops the size and the larger ones; the
warm pass captures nothing.
"""
from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")

from sglang.sm120.runner import boundary  # noqa: E402
from sglang.sm120.runner.backend import LayerwiseDecodeBackend  # noqa: E402
from sglang.sm120.runner.boundary import boundary_active, cross  # noqa: E402
from cpu_graph import RecordingGraph  # noqa: E402
from sglang.srt.model_executor.runner.shape_key import ShapeKey  # noqa: E402
from test_runner_segments import MOE_SCALE, ToyModel, ToyMoE, moe_scale_provider  # noqa: E402


class DenseMoE(ToyMoE):
    """Same maths as ToyMoE without host syncs, so it can also be captured whole."""

    def forward(self, hidden_states, topk_output):
        if boundary_active():
            return cross(self, hidden_states, topk_output)
        self.calls += 1
        weights, ids, _ = topk_output
        per_expert = torch.relu(torch.einsum("th,ehi->tei", hidden_states, self.w1))
        per_expert = torch.einsum("tei,eih->teh", per_expert, self.w2)
        gate = torch.zeros(ids.shape[0], self.w1.shape[0], dtype=weights.dtype)
        gate.scatter_add_(1, ids.long(), weights)
        return (per_expert * gate.unsqueeze(-1)).sum(1) * MOE_SCALE.get()


class FakeDeviceModule:
    def synchronize(self):
        pass

    def graph_pool_handle(self):
        return ("cpu-pool",)

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None):
        cuda_graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            cuda_graph.capture_end()


class FakeTP:
    world_size = 1

    def barrier(self):
        pass


@pytest.fixture(autouse=True)
def _emulated_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", RecordingGraph)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    boundary.register_state_provider(moe_scale_provider)
    from sglang.srt.runtime_context import get_resources

    get_resources().graph_memory_pool = None
    # Upstream's backends take the tensor-parallel group from the model runner (0.5.16) or from
    # the runtime context (0.5.23): give both the fake.
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_group=FakeTP()):
        yield
    boundary._STATE_PROVIDERS.remove(moe_scale_provider)


def _make(model, sizes, full_max_bs):
    runner = SimpleNamespace(
        device_module=FakeDeviceModule(),
        model_runner=SimpleNamespace(tp_group=FakeTP()),
        capture_bs=sizes,
        captured_req_width=1,
        device="cpu",
    )
    backend = LayerwiseDecodeBackend(runner, full_max_bs=full_max_bs)
    backend.graph_factory = RecordingGraph
    static_ids = torch.randint(0, 50, (max(sizes),))
    return backend, static_ids


def _capture_all(backend, model, static_ids, sizes, fail=None):
    backend.mode = "capture"
    calls = {}
    with backend.capture_session(None):
        for size in sorted(sizes, reverse=True):

            def forward(size=size):
                calls[size] = calls.get(size, 0) + 1
                if fail is not None:
                    fail(size, calls[size])
                with torch.no_grad():
                    return model(static_ids[:size])

            backend.capture_one(ShapeKey(size=size), forward)
    return calls


def _check_replays(backend, model, static_ids, sizes):
    for _ in range(2):
        ids = torch.randint(0, 50, static_ids.shape)
        static_ids.copy_(ids)
        with torch.no_grad():
            want = model(ids)
        for size in sizes:
            key = ShapeKey(size=size)
            assert backend.can_run(None, key)
            with torch.no_grad():
                got = backend.replay(key, None)
            torch.testing.assert_close(got, want[:size], rtol=1e-5, atol=1e-5)


def test_full_below_ceiling_layerwise_above_both_replay_correctly():
    sizes = [1, 2, 4, 8, 16]
    model, backend, static_ids = _dense_backend(sizes, full_max_bs=4)
    _capture_all(backend, model, static_ids, sizes)
    report = backend.report()
    assert report["full"] == [1, 2, 4] and report["layerwise"] == [8, 16]
    assert report["segments_per_size"] == 3 and report["moe_capturable"] is True
    assert report["graphs"] == 2 * 3  # two layerwise sizes x 3 segments (the full graphs are upstream's)
    assert set(backend._graphs) == {ShapeKey(size=s) for s in (1, 2, 4)}
    _check_replays(backend, model, static_ids, sizes)


def test_uncapturable_moe_makes_every_size_layerwise():
    model = ToyModel(layers=2)  # ToyMoE syncs with the host: a whole-forward capture fails
    sizes = [1, 2, 4, 8]
    backend, static_ids = _make(model, sizes, full_max_bs=4)
    _capture_all(backend, model, static_ids, sizes)
    report = backend.report()
    assert report["full"] == [] and report["layerwise"] == [1, 2, 4, 8]
    assert report["moe_capturable"] is False and "HostSyncInCapture" in report["fallback_reason"]
    _check_replays(backend, model, static_ids, sizes)


def test_oom_drops_the_size_and_larger_ones():
    model = ToyModel(layers=1)
    sizes = [2, 4, 8, 16]
    backend, static_ids = _make(model, sizes, full_max_bs=0)

    def fail(size, call):  # size 8: the warmup forward works, the capture forward runs out
        if size == 8 and call == 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    _capture_all(backend, model, static_ids, sizes, fail=fail)
    assert backend.servable_sizes() == [2, 4]
    assert backend.report()["dropped"] == [8, 16]
    assert not backend.can_run(None, ShapeKey(size=16)) and not backend.can_run(None, ShapeKey(size=8))
    assert boundary._SESSION is None
    _check_replays(backend, model, static_ids, [2, 4])


@pytest.mark.parametrize("rows", ["padded", "real"])
def test_warm_mode_runs_eagerly_and_captures_nothing(monkeypatch, rows):
    from sglang.sm120.runner.backend import MOE_ROWS_ENV

    monkeypatch.setenv(MOE_ROWS_ENV, rows)
    model = ToyModel(layers=1)
    backend, static_ids = _make(model, [2, 4], full_max_bs=0)
    assert backend.mode == "warm"
    with backend.capture_session(None):
        for size in (4, 2):
            backend.capture_one(ShapeKey(size=size), lambda s=size: model(static_ids[:s]))
    # two eager forwards per size; with real rows, before the first (largest) size, one recording
    # forward and the MoE alone at every row count 1..4
    assert model.layers[0].experts.calls == (4 if rows == "padded" else 4 + 1 + 4)
    assert not backend.entries and not backend._graphs
    assert backend.report()["moe_rows"] == rows


def test_layerwise_replay_runs_the_moe_on_the_runner_s_real_rows():
    model = ToyModel(layers=2)
    sizes = [4, 8]
    backend, static_ids = _make(model, sizes, full_max_bs=0)
    _capture_all(backend, model, static_ids, sizes)
    seen = []
    for layer in model.layers:
        inner = layer.experts.forward
        layer.experts.forward = lambda h, t, _f=inner: (seen.append(h.shape[0]), _f(h, t))[1]
    ids = torch.randint(0, 50, (8,))
    static_ids.copy_(ids)
    with torch.no_grad():
        want = model(ids[:6])
    seen.clear()
    backend._runner.raw_num_token = 6  # what DecodeCudaGraphRunner.load_batch sets before replay
    with torch.no_grad():
        got = backend.replay(ShapeKey(size=8), None)
    assert seen == [6, 6] and boundary._REAL_ROWS is None  # reset after the replay
    torch.testing.assert_close(got[:6], want, rtol=1e-5, atol=1e-5)


def test_injected_oom_env_drops_from_that_size(monkeypatch):
    from sglang.sm120.runner.backend import INJECT_OOM_ENV

    monkeypatch.setenv(INJECT_OOM_ENV, "4")
    model = ToyModel(layers=1)
    sizes = [1, 2, 4, 8]
    backend, static_ids = _make(model, sizes, full_max_bs=0)
    _capture_all(backend, model, static_ids, sizes)
    assert backend.servable_sizes() == [1, 2] and backend.report()["dropped"] == [4, 8]
    _check_replays(backend, model, static_ids, [1, 2])


def test_oom_in_the_warm_pass_drops_before_capture():
    model = ToyModel(layers=1)
    sizes = [2, 4, 8]
    backend, static_ids = _make(model, sizes, full_max_bs=0)

    def forward(size):
        def run():
            if size == 4:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated warm pass)")
            with torch.no_grad():
                return model(static_ids[:size])
        return run

    with backend.capture_session(None):  # warm mode
        for size in (8, 4, 2):
            backend.capture_one(ShapeKey(size=size), forward(size))
    assert backend._warm_oom == 4
    _capture_all(backend, model, static_ids, sizes)
    assert backend.servable_sizes() == [2] and backend.report()["dropped"] == [4, 8]


def test_deferred_capture_warms_first_and_captures_under_armed_traps(monkeypatch, capsys):
    """Runner flow: the constructor's capture() only warms (nothing captured, runner pending);
    startup.finish() arms the traps before the first graph, so a subprocess during capture raises."""
    import subprocess

    from sglang.sm120 import traps
    from sglang.sm120.runner import runners, startup

    model = ToyModel(layers=1)
    sizes = [2, 4]
    backend, static_ids = _make(model, sizes, full_max_bs=0)
    spawn_during_capture = []

    class FakeUpstreamRunner:  # the part of DecodeCudaGraphRunner the mixin relies on
        def __init__(self):
            self.model_runner = SimpleNamespace(device="cpu")
            self.device_module = FakeDeviceModule()
            self.backend = backend
            self.capture_bs = list(sizes)
            self.capture()

        def capture(self):
            with self.backend.capture_session(None):
                for s in sorted(self.capture_bs, reverse=True):
                    def fwd(s=s):
                        if self.backend.mode == "capture" and spawn_during_capture:
                            subprocess.run(["true"])
                        with torch.no_grad():
                            return model(static_ids[:s])
                    self.backend.capture_one(ShapeKey(size=s), fwd)

    class Runner(runners._DeferredCaptureMixin, FakeUpstreamRunner):
        phase = "decode"

        def capture(self):
            self._lw_capture(super().capture)

        def finish_layerwise_capture(self):
            self._lw_finish(self.capture)

        def _lw_apply_servable(self):
            self.capture_bs = self._lw_servable()

    # free memory drops 1000 B over the capture, of which the allocator took 300 B (the first
    # capture attempt below stops at a trap after reading "before")
    points = iter([dict(free=f, reserved=r, allocated=0, pool=0, pool_blocks=frozenset())
                   for f, r in ((5000, 700), (5000, 700), (4000, 1000))])
    monkeypatch.setattr(runners, "memory_point", lambda pool: next(points))
    monkeypatch.setattr("sglang.sm120.runner.prewarm.warm_sampling", lambda mr: None)
    monkeypatch.setenv(traps.ENV_MODE, "raise")
    try:
        runner = Runner()
        assert not backend.entries and startup.pending(runner.model_runner) == [runner]
        # warm: 2 eager forwards x 2 sizes, and before the first, one recording forward and the
        # MoE alone at every row count 1..4 (real rows, the default)
        assert model.layers[0].experts.calls == 4 + 1 + 4
        assert not traps.armed()
        spawn_during_capture.append(True)
        with pytest.raises(traps.TrapViolation):
            startup.finish(runner.model_runner)
        assert traps.armed()
        traps.disarm()
        spawn_during_capture.clear()
        backend.cleanup()
        capsys.readouterr()
        runner.finish_layerwise_capture()
        assert runner._lw_finished and runner.capture_bs == [2, 4]
        line = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(runners.CAPTURE_TAG + " ")]
        rep = json.loads(line[-1][len(runners.CAPTURE_TAG) + 1:])
        assert (rep["mem_bytes"], rep["allocator_bytes"], rep["outside_allocator_bytes"]) == (1000, 300, 700)
        assert rep["graphs"] == 2 * rep["segments_per_size"]
        _check_replays(backend, model, static_ids, [2, 4])
    finally:
        traps.disarm()
        traps.clear_violations()
        startup._PENDING.clear()


def _dense_backend(sizes, full_max_bs):
    """A two-layer toy model whose MoE is capturable, and a backend for its sizes."""
    model = ToyModel(layers=2)
    for layer in model.layers:
        layer.experts.__class__ = DenseMoE
    backend, static_ids = _make(model, sizes, full_max_bs=full_max_bs)
    return model, backend, static_ids


def test_report_times_each_size_warm_probe_and_capture():
    sizes = [1, 2, 4, 8]
    model, backend, static_ids = _dense_backend(sizes, full_max_bs=2)
    with backend.capture_session(None):  # warm pass, as upstream's runner constructor runs it
        for size in sorted(sizes, reverse=True):
            backend.capture_one(ShapeKey(size=size), lambda s=size: model(static_ids[:s]))
    _capture_all(backend, model, static_ids, sizes)
    timings = backend.report()["size_timings"]
    assert list(timings) == ["1", "2", "4", "8"]
    gaps = {"warm_gap_s", "capture_gap_s"}
    for size in ("4", "8"):  # layerwise sizes: warm pass, probe forward, captured forward
        rows = {"rows_warm_s"} if size == "8" else set()  # the MoE at every row count, largest size
        assert set(timings[size]) - gaps == {"warm_s", "probe_s", "capture_s"} | rows
    for size in ("1", "2"):  # full graphs: upstream's capture, only the warm pass is ours
        assert set(timings[size]) - gaps == {"warm_s"}
    # upstream's loop between our calls, in each pass from its second size on (largest first)
    for gap in gaps:
        assert [s for s in ("8", "4", "2", "1") if gap in timings[s]] == ["4", "2", "1"]
    assert all(v >= 0 for t in timings.values() for v in t.values())


def test_warm_runs_the_moe_at_every_row_count_largest_first(monkeypatch, caplog):
    """Counting down, the allocator's blocks freed by one row count serve every smaller one;
    counting up (as before), each count outgrows the cached blocks: the first H200 run lost ~4.3 GB
    of free memory in this step on a tiny model, which the server logged as decode graph memory.
    The log line counts the islands it ran (it said 0: counted after clearing them)."""
    seen = []
    real = boundary.warm_rows

    def recording(kept, row_counts, lean=None):
        seen.append(list(row_counts))
        return real(kept, seen[-1], lean)

    monkeypatch.setattr(boundary, "warm_rows", recording)
    sizes = [1, 2, 4, 8]
    model, backend, static_ids = _dense_backend(sizes, full_max_bs=2)
    with caplog.at_level("INFO", logger="sglang.sm120.runner.backend"), backend.capture_session(None):
        for size in sorted(sizes, reverse=True):
            backend.capture_one(ShapeKey(size=size), lambda s=size: model(static_ids[:s]))
    assert seen == [[8, 7, 6, 5, 4, 3, 2, 1]]
    assert "1 distinct MoE island(s) run at every row count 1..8" in caplog.text


def test_report_splits_each_captured_sizes_memory_by_kind(monkeypatch):
    from sglang.sm120.runner.backend import TIMING_ENV
    from sglang.sm120.runner.memory import memory_delta

    monkeypatch.setenv(TIMING_ENV, "1")  # the per-size readings are diagnostics
    sizes = [1, 2, 4, 8]
    model, backend, static_ids = _dense_backend(sizes, full_max_bs=2)
    _capture_all(backend, model, static_ids, sizes)
    report = backend.report()
    mem = report["size_memory"]
    assert {k: v["kind"] for k, v in mem.items()} == {"1": "full", "2": "full", "4": "layerwise", "8": "layerwise"}
    for v in mem.values():  # no CUDA here: every part reads 0
        assert {k: v[k] for k in ("allocated", "reserved", "pool", "outside", "kept_blocks")} == dict.fromkeys(
            ("allocated", "reserved", "pool", "outside", "kept_blocks"), 0)
    assert report["memory_accounting_s"] >= 0
    # what each size's output holds, for full graphs (upstream's store) and layerwise entries alike
    for size in sizes:
        out = backend._captured_output(ShapeKey(size=size))
        assert isinstance(out, torch.Tensor) and mem[str(size)]["output_bytes"] == out.untyped_storage().nbytes() > 0
    # 10 MB left free memory: 6 MB of it into torch's allocator (4 MB of that the graph pool), 4 MB outside
    before = {"allocated": 100, "reserved": 1000, "pool": 200, "free": 50_000_000,
              "pool_blocks": frozenset({(0, 512)})}
    after = {"allocated": 150, "reserved": 1000 + 6_000_000, "pool": 200 + 4_000_000, "free": 40_000_000,
             "pool_blocks": frozenset({(0, 512), (4096, 2048), (8192, 1 << 20)})}
    assert memory_delta(before, after) == {"allocated": 50, "reserved": 6_000_000, "pool": 4_000_000,
                                           "outside": 4_000_000, "kept_blocks": 2,
                                           "kept_largest": [1 << 20, 2048]}


def test_without_the_diagnostics_switch_no_size_is_read(monkeypatch):
    from sglang.sm120.runner import backend as backend_mod

    monkeypatch.delenv(backend_mod.TIMING_ENV, raising=False)
    monkeypatch.setattr(backend_mod, "memory_point", lambda pool: pytest.fail("read memory without diagnostics"))
    sizes = [1, 2, 4]
    model, backend, static_ids = _dense_backend(sizes, full_max_bs=1)
    _capture_all(backend, model, static_ids, sizes)
    report = backend.report()
    assert report["size_memory"] == {} and report["memory_accounting_s"] == 0


def test_held_bytes_counts_each_allocation_behind_an_output_once():
    from dataclasses import dataclass

    from sglang.sm120.runner.memory import held_bytes

    @dataclass
    class Out:  # shaped like upstream's LogitsProcessorOutput: tensors and None in fields
        next_token_logits: torch.Tensor
        hidden_states: object = None
        extra: object = None

    base = torch.zeros(64, 100, dtype=torch.bfloat16)  # 12,800 B
    other = torch.zeros(10, dtype=torch.float32)  # 40 B
    out = Out(base[:8], hidden_states=(base[8:16], {"x": other}), extra=[base, "constant", 3])
    assert held_bytes(out) == 64 * 100 * 2 + 10 * 4  # views count their whole allocation, once
    assert held_bytes(None) == 0 and held_bytes(Out) == 0  # a class is not an instance


def test_attention_islands_plan_the_real_batch_for_layerwise_sizes_only():
    """Decode attention islands through the real backend: load_batch's plan_real_batch plans the
    replay's real batch (and only for a size captured with islands), and the replay matches the
    unpadded eager forward (toy model and backend: test_runner_decode_attention.py)."""
    from test_runner_decode_attention import PADDING_SLOT, Batch, Model, real_batch

    torch.manual_seed(3)
    model = Model(moe=DenseMoE)  # capturable whole: size 2 is a full graph
    runner = SimpleNamespace(
        device_module=FakeDeviceModule(), captured_req_width=1, device="cpu", capture_bs=[2, 4, 8],
        model_runner=SimpleNamespace(tp_group=FakeTP(), attn_backend=model.backend), attn_backend=model.backend)
    backend = LayerwiseDecodeBackend(runner, full_max_bs=2)
    backend.graph_factory = RecordingGraph
    assert backend.attention_islands
    static_ids = torch.randint(0, 50, (8,))
    backend.mode = "capture"
    with backend.capture_session(None):
        for size in (8, 4, 2):
            dummy = Batch(size, torch.full((size,), PADDING_SLOT))
            model.backend.init_forward_metadata(dummy)  # upstream plans outside the captured forward

            def forward(size=size, dummy=dummy):
                with torch.no_grad():
                    return model(static_ids[:size], dummy)

            backend.capture_one(ShapeKey(size=size), forward)
    report = backend.report()
    assert report["full"] == [2] and report["layerwise"] == [4, 8]
    assert report["decode_attention"] == "eager" and report["attention_steps"] == 2 * 2

    ids = torch.randint(0, 50, (8,))
    static_ids.copy_(ids)
    batch = real_batch(6)
    model.backend.init_forward_metadata(batch)
    with torch.no_grad():
        want = model(ids[:6], batch)
    with pytest.raises(RuntimeError, match="plan_real_batch"):
        backend.replay(ShapeKey(size=8), batch)
    model.backend.plans.clear()
    runner.raw_num_token = 6
    backend.plan_real_batch(ShapeKey(size=8), batch, model.backend)  # what load_batch calls
    assert model.backend.plans == [6]
    with torch.no_grad():
        got = backend.replay(ShapeKey(size=8), batch)
    torch.testing.assert_close(got[:6], want, rtol=1e-6, atol=1e-6)
    assert boundary._REAL_BATCH is None and backend._real_batch is None  # reset after the replay
    backend.plan_real_batch(ShapeKey(size=2), real_batch(2), model.backend)  # a full graph: upstream's plan
    assert model.backend.plans == [6] and backend._real_batch is None


def test_decode_attention_stays_captured_where_islands_do_not_apply():
    model = ToyModel(layers=1)
    backend, _ = _make(model, [2, 4], full_max_bs=0)  # its model runner has no FlashInfer backend
    assert not backend.attention_islands and backend.report()["decode_attention"] == "captured"
