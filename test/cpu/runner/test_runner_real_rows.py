"""Real rows (boundary.py): a layerwise replay runs each MoE island on the batch's real rows, as
graphs disabled runs the MoE on the unpadded batch. The toy MoE picks its "kernel config" by its
row count, like upstream's Triton MoE (another config, another summation order): on padded rows
the replay would differ from the unpadded eager forward, on real rows it does not."""
from __future__ import annotations

import pytest
import torch

from sglang.sm120.runner import boundary
from sglang.sm120.runner.boundary import RecordingSession, StagingArena, warm_rows
from cpu_graph import RecordingGraph
from sglang.sm120.runner.layerwise import capture_size
from test_runner_segments import ToyModel, moe_scale_provider

SMALL_CONFIG_ROWS = 4  # up to this many rows the toy MoE takes its "small" config


class RowsSeen:
    def __init__(self, model):
        self.rows = []
        for layer in model.layers:
            moe = layer.experts
            inner = type(moe).forward

            def forward(hidden_states, topk_output, _moe=moe, _inner=inner):
                out = _inner(_moe, hidden_states, topk_output)
                if boundary.boundary_active():
                    return out
                self.rows.append(hidden_states.shape[0])
                # the config the row count selects changes the rounding (here: a visible factor)
                return out * (1.0 if hidden_states.shape[0] <= SMALL_CONFIG_ROWS else 1.001)

            moe.forward = forward


@pytest.fixture(autouse=True)
def _state_provider():
    boundary.register_state_provider(moe_scale_provider)
    yield
    boundary._STATE_PROVIDERS.remove(moe_scale_provider)
    boundary.set_replaying_rows(None)
    boundary.set_replaying_batch(None)


def _capture(model, static_ids, rows, arena, real_rows):
    with torch.no_grad():
        return capture_size(lambda: model(static_ids[:rows]), arena=arena, warmups=1,
                            graph_factory=RecordingGraph, real_rows=real_rows)


@pytest.mark.parametrize("real", [3, 8])
def test_replay_on_real_rows_equals_the_unpadded_eager_forward(real):
    torch.manual_seed(1)
    model = ToyModel(layers=2)
    seen = RowsSeen(model)
    static_ids = torch.randint(0, 50, (8,))
    entry = _capture(model, static_ids, 8, StagingArena(8, "cpu"), real_rows=True)
    padded = _capture(model, static_ids, 8, StagingArena(8, "cpu"), real_rows=False)
    ids = torch.randint(0, 50, (8,))
    static_ids.copy_(ids)  # rows real.. are padding (whatever ids the runner leaves there)
    with torch.no_grad():
        want = model(ids[:real])
    seen.rows.clear()
    with torch.no_grad(), boundary.replaying_rows(real):
        entry.graph.replay()
    assert seen.rows == [real, real]  # each island ran on the real rows only
    torch.testing.assert_close(entry.output[:real], want, rtol=1e-6, atol=1e-6)
    with torch.no_grad(), boundary.replaying_rows(real):
        padded.graph.replay()  # the same replay on all 8 rows: the "other config"
    if real <= SMALL_CONFIG_ROWS:
        assert not torch.allclose(padded.output[:real], want, rtol=1e-6, atol=1e-6)
    # the step for `real` rows is built once and reused; an undeclared replay runs every row
    step = entry.graph.steps[0]
    assert isinstance(step, boundary._RealRowsStep)
    if real < 8:
        assert list(step.by_rows) == [real]
    seen.rows.clear()
    with torch.no_grad():
        entry.graph.replay()
    assert seen.rows == [8, 8]


def test_padded_rows_of_the_moe_output_are_zeroed():
    torch.manual_seed(2)
    model = ToyModel(layers=1)
    RowsSeen(model)
    static_ids = torch.randint(0, 50, (6,))
    arena = StagingArena(6, "cpu")
    entry = _capture(model, static_ids, 6, arena, real_rows=True)
    step = entry.graph.steps[0]
    out_view = step.out_views[0]
    out_view.fill_(float("nan"))
    with torch.no_grad(), boundary.replaying_rows(2):
        entry.graph.segments[0].replay()
        step()  # (the next segment's fused norm writes into this buffer, so look before it runs)
    assert torch.isfinite(out_view[:2]).all() and (out_view[2:] == 0).all()


def test_recording_keeps_one_island_per_kind_and_warm_rows_runs_every_count():
    torch.manual_seed(3)
    model = ToyModel(layers=3)  # three layers, one kind of MoE (same shapes, same inputs' shapes)
    seen = RowsSeen(model)
    rec = RecordingSession()
    with torch.no_grad(), rec:
        eager = model(torch.randint(0, 50, (7,)))
    assert eager.shape == (7, 50) and rec.calls == 3 and len(rec.kept) == 1
    seen.rows.clear()
    with torch.no_grad():
        calls = warm_rows(rec.kept, range(1, 8))
    assert calls == 7 and seen.rows == [1, 2, 3, 4, 5, 6, 7]
    assert boundary._SESSION is None
