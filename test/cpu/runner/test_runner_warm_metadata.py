"""The layerwise decode runner's warm pass runs the attention backend's replay-time metadata step.

Upstream captures a decode size by calling `init_forward_metadata_out_graph` once. DSA builds its
per-size metadata on that first call and runs its replay kernel (a Triton kernel specialised on
the batch size) only from the second call on. The layerwise runner captures twice (warm pass,
then the real pass with the traps armed), so without a second call in the warm pass that kernel
first compiled inside the armed capture pass. These tests run the runner's own capture_one_shape
with a backend that has DSA's first-call behaviour.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

D = pytest.importorskip("sglang.srt.model_executor.runner.decode_cuda_graph_runner")

from sglang.sm120.runner.runners import LayerwiseDecodeRunner  # noqa: E402


class FirstCallBuildsBackend:
    """DSA's shape: the first call for a size builds metadata, later calls run the replay kernel."""

    def __init__(self):
        self.built, self.replay_kernel_sizes, self.calls = set(), [], []

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        bs = forward_batch.batch_size
        self.calls.append((bs, in_capture))
        if bs not in self.built:
            self.built.add(bs)
            return
        self.replay_kernel_sizes.append(bs)


def _runner(monkeypatch, mode):
    attn = FirstCallBuildsBackend()
    r = object.__new__(LayerwiseDecodeRunner)
    r.backend = SimpleNamespace(mode=mode, attention_islands=False, _full_max_bs=0)
    r.captured_req_width = 1
    r.ragged_verify_mode = False
    r.capture_prepare = lambda bs, stream_idx=None, num_tokens=None: (
        SimpleNamespace(batch_size=bs), attn, None)

    def upstream_capture_one_shape(self, size, forward, stream_idx=None, variant_label=None):
        fb, backend, _ = self.capture_prepare(size, stream_idx=stream_idx, num_tokens=size)
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        forward()

    monkeypatch.setattr(D.DecodeCudaGraphRunner, "capture_one_shape", upstream_capture_one_shape)
    return r, attn


def test_warm_pass_runs_the_replay_metadata_kernel_at_every_size(monkeypatch):
    r, attn = _runner(monkeypatch, "warm")
    for bs in (16, 8, 1):
        r.capture_one_shape(bs, lambda: None)
    assert attn.replay_kernel_sizes == [16, 8, 1]
    # upstream's capture call, then the replay variant (what runs before every replay)
    assert attn.calls == [(16, True), (16, False), (8, True), (8, False), (1, True), (1, False)]


def test_capture_pass_adds_no_extra_metadata_step(monkeypatch):
    r, attn = _runner(monkeypatch, "capture")
    attn.built.update({8, 1})  # as the warm pass left it
    for bs in (8, 1):
        r.capture_one_shape(bs, lambda: None)
    assert attn.replay_kernel_sizes == [8, 1]  # one call per size: upstream's own


def test_without_the_warm_step_the_capture_pass_would_meet_the_kernel_first(monkeypatch):
    """The failure the override prevents: upstream's method alone, warm pass then capture pass."""
    r, attn = _runner(monkeypatch, "warm")
    for bs in (8, 1):
        D.DecodeCudaGraphRunner.capture_one_shape(r, bs, lambda: None)
    assert attn.replay_kernel_sizes == []  # nothing compiled the replay kernel before the traps


def test_upstream_dsa_builds_on_the_first_call_and_runs_its_kernel_later():
    """Pins the upstream fact the warm step exists for (fails if DSA stops deferring its kernel)."""
    dsa = pytest.importorskip("sglang.srt.layers.attention.dsa_backend")
    src = inspect.getsource(dsa.DeepseekSparseAttnBackend._apply_cuda_graph_metadata)
    build = src.index("if bs not in self.decode_cuda_graph_metadata")
    early_return = src.index("return", build)
    # the replay kernel's call: the function (0.5.16) or the backend's wrapper of it (0.5.23)
    kernel = min(i for i in (src.find("fused_dsa_decode_metadata("), src.find("self._fused_decode_metadata(")) if i >= 0)
    assert build < early_return < kernel


def test_warm_pass_runs_decode_attention_on_the_real_batch_plan_at_layerwise_sizes(monkeypatch):
    """With attention islands (decode_attention.py) a replay plans its real batch eagerly and runs
    attention on it: the warm pass runs that path (the eager plan, then one eager forward) at each
    size above the full-graph ceiling, none at or below it."""
    r, attn = _runner(monkeypatch, "warm")
    r.backend.attention_islands, r.backend._full_max_bs = True, 8
    events = []
    attn.init_forward_metadata = lambda fb: events.append(("plan", fb.batch_size))
    fb_of = {}

    def prepare(bs, stream_idx=None, num_tokens=None):
        fb = fb_of.setdefault(bs, SimpleNamespace(batch_size=bs, input_ids=f"ids{bs}", positions=f"pos{bs}"))
        return fb, attn, None

    r.capture_prepare = prepare
    r.device_module = SimpleNamespace(synchronize=lambda: None)
    r.model_runner = SimpleNamespace(model=SimpleNamespace(
        forward=lambda ids, pos, fb: events.append(("forward", fb.batch_size, ids, pos))))
    for bs in (16, 12, 8, 1):
        r.capture_one_shape(bs, lambda: None)
    assert events == [("plan", 16), ("forward", 16, "ids16", "pos16"), ("plan", 12), ("forward", 12, "ids12", "pos12")]
    r.backend.mode = "capture"
    events.clear()
    r.capture_one_shape(16, lambda: None)
    assert events == []  # the capture pass adds nothing


def test_load_batch_plans_the_real_batch_after_upstream_s_own_load(monkeypatch):
    """The runner's load_batch (before the replay's read-done event) hands the batch and the key
    upstream's load_batch chose to the backend, which plans it where the size has attention islands."""
    r, attn = _runner(monkeypatch, "capture")
    r.attn_backend = attn
    order = []

    def upstream_load_batch(self, forward_batch, pp_proxy_tensors=None):
        order.append(("upstream", forward_batch.batch_size))
        self._replay_graph_key = f"key{forward_batch.batch_size}"

    monkeypatch.setattr(D.DecodeCudaGraphRunner, "load_batch", upstream_load_batch)
    r.backend.plan_real_batch = lambda key, fb, backend: order.append(("plan", key, fb.batch_size, backend))
    r.load_batch(SimpleNamespace(batch_size=300))
    assert order == [("upstream", 300), ("plan", "key300", 300, attn)]
