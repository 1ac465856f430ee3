"""Segmented capture: one plain CUDA graph per stretch of the forward, eager steps between them.

A `SegmentedGraph` is a list of graph segments and the eager steps that run between consecutive
segments. `SegmentCapture` records one: it keeps a graph capture open on the capture stream, and
`cut(step)` closes the current segment, appends `step` and opens the next one. All segments of
all sizes share one memory pool; tensors that cross a cut keep their pool addresses because the
graphs that allocated them stay alive.

The graph object comes from an injectable factory (default `torch.cuda.CUDAGraph`), so the same
code is exercised on CPU with a graph emulator in the tests. No sglang imports here.
"""
from __future__ import annotations

import atexit
import contextlib
import cProfile
import pstats
import time
from typing import Any, Callable, Dict, List, Optional, Protocol

import torch

from .. import settings


class GraphLike(Protocol):
    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None: ...

    def capture_end(self) -> None: ...

    def replay(self) -> None: ...


GraphFactory = Callable[[], GraphLike]


# SGLANG_SM120_LAYERWISE_PROFILE=FILE (with SGLANG_SM120_LAYERWISE_TIMING=1): cProfile of the eager
# steps between segments (the MoE's host path), written to FILE at exit, to show where their
# host time goes. Diagnostics only: the profiler slows those steps down.
PROFILE_ENV = "SGLANG_SM120_LAYERWISE_PROFILE"
_step_profiler: Optional[cProfile.Profile] = None


def _profiler() -> Optional[cProfile.Profile]:
    global _step_profiler
    path = settings.path(PROFILE_ENV)
    if path and _step_profiler is None:
        _step_profiler = cProfile.Profile()
        atexit.register(_write_profile, _step_profiler, path)
    return _step_profiler


def _write_profile(prof: cProfile.Profile, path: str) -> None:
    with open(path, "w") as f:
        stats = pstats.Stats(prof, stream=f)
        f.write("eager steps between layerwise segments, by own time\n")
        stats.sort_stats("tottime").print_stats(40)
        f.write("\nby cumulative time\n")
        stats.sort_stats("cumulative").print_stats(40)


def cuda_graph_factory() -> GraphLike:
    return torch.cuda.CUDAGraph()


class SegmentedGraph:
    """Replays segment 0, step 0, segment 1, step 1, ..., last segment."""

    def __init__(self) -> None:
        self.segments: List[GraphLike] = []
        self.steps: List[Callable[[], None]] = []
        # Host seconds spent in eager steps, accumulated only by replay_timed (bench use): wall
        # time, and the thread's CPU time (wall minus CPU is time the step waited, e.g. in a
        # launch call blocked on a full GPU queue).
        self.step_host_seconds = 0.0
        self.step_cpu_seconds = 0.0
        self.timed_replays = 0
        # decode attention steps (boundary._AttentionStep) are timed apart: the totals above are
        # the MoE steps', what the per-layer MoE figure divides
        self.attention_host_seconds = 0.0

    def replay(self) -> None:
        steps = self.steps
        n_steps = len(steps)
        for i, seg in enumerate(self.segments):
            seg.replay()
            if i < n_steps:
                steps[i]()

    def replay_timed(self) -> None:
        """Like replay, but accumulates the host time of the eager steps (no device sync:
        it measures launch cost, which is what an eager MoE adds per layer)."""
        clock, cpu_clock = time.perf_counter, time.thread_time
        steps = self.steps
        n_steps = len(steps)
        spent = cpu = attention = 0.0
        prof = _profiler()
        for i, seg in enumerate(self.segments):
            seg.replay()
            if i < n_steps:
                t0, c0 = clock(), cpu_clock()
                if prof is not None:
                    prof.enable()
                steps[i]()
                if prof is not None:
                    prof.disable()
                if getattr(steps[i], "attention", False):
                    attention += clock() - t0
                else:
                    spent += clock() - t0
                    cpu += cpu_clock() - c0
        self.step_host_seconds += spent
        self.step_cpu_seconds += cpu
        self.attention_host_seconds += attention
        self.timed_replays += 1

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    def release(self) -> None:
        self.segments.clear()
        self.steps.clear()


class StreamForkTracker:
    """Side streams that joined the capture (forked) and have not been joined back.

    A segment cannot end while a forked side stream is still part of its capture, and a side
    stream that was part of the capture before a cut must be part of the next segment's capture
    again before model code launches on it. `on_wait` sees every `waiter.wait_stream(waited)`.
    """

    def __init__(self, is_capture_stream: Callable[[Any], bool], key: Callable[[Any], Any] = id):
        self._is_capture = is_capture_stream
        self._key = key
        self._forked: Dict[Any, Any] = {}

    def on_wait(self, waiter, waited) -> None:
        if self._is_capture(waited) and not self._is_capture(waiter):
            self._forked[self._key(waiter)] = waiter
        elif self._is_capture(waiter) and not self._is_capture(waited):
            self._forked.pop(self._key(waited), None)

    def pending(self) -> List[Any]:
        return list(self._forked.values())

    def clear(self) -> None:
        self._forked.clear()


class SegmentCapture:
    """Records one SegmentedGraph. Use as a context manager; call `cut(step)` at each eager island.

    graph_factory: makes one graph per segment.
    pool: memory pool handle shared by every segment (and every size).
    stream: capture stream (a torch.cuda.Stream); None captures on the current stream (CPU tests).
    track_side_streams: hook torch.cuda.Stream.wait_stream while capturing so side streams forked
        into a segment are joined before the cut and forked again after it.
    """

    def __init__(
        self,
        graph: SegmentedGraph,
        *,
        graph_factory: GraphFactory = cuda_graph_factory,
        pool=None,
        stream=None,
        track_side_streams: bool = False,
    ) -> None:
        self.graph = graph
        self._factory = graph_factory
        self._pool = pool
        self._stream = stream
        self._track = track_side_streams
        self._current: Optional[GraphLike] = None
        self._exit_stack: Optional[contextlib.ExitStack] = None
        self._tracker: Optional[StreamForkTracker] = None
        self._refork: List[Any] = []
        self.cuts = 0

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> "SegmentCapture":
        stack = contextlib.ExitStack()
        try:
            if self._stream is not None:
                stack.enter_context(torch.cuda.stream(self._stream))
            if self._track:
                stack.enter_context(self._tracking_wait_stream())
            self._begin()
        except BaseException:
            stack.close()
            raise
        self._exit_stack = stack
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self._current is not None:
                if exc_type is None:
                    self._end()
                else:
                    # Leave capture mode whatever happened; the partial graph is discarded.
                    graph, self._current = self._current, None
                    with contextlib.suppress(Exception):
                        graph.capture_end()
        finally:
            if self._exit_stack is not None:
                self._exit_stack.close()
                self._exit_stack = None
        return False

    # -- segments ---------------------------------------------------------------------------
    def cut(self, step: Callable[[], None]) -> None:
        """End the current segment, run `step` there at replay, start the next segment."""
        if self._current is None:
            raise RuntimeError("SegmentCapture.cut() outside an open capture")
        self._end()
        self.graph.steps.append(step)
        self.cuts += 1
        self._begin()

    def _begin(self) -> None:
        graph = self._factory()
        graph.capture_begin(pool=self._pool)
        self._current = graph
        for side in self._refork:
            side.wait_stream(self._capture_stream())
        self._refork = []

    def _end(self) -> None:
        if self._tracker is not None:
            pending = self._tracker.pending()
            main = self._capture_stream()
            for side in pending:
                main.wait_stream(side)
            self._tracker.clear()
            self._refork = pending
        graph, self._current = self._current, None
        graph.capture_end()
        self.graph.segments.append(graph)

    def _capture_stream(self):
        return self._stream if self._stream is not None else torch.cuda.current_stream()

    @contextlib.contextmanager
    def _tracking_wait_stream(self):
        cls = torch.cuda.Stream
        original = cls.wait_stream
        cap = self._capture_stream()
        cap_handle = cap.cuda_stream

        def is_capture(s) -> bool:
            return s is cap or getattr(s, "cuda_stream", None) == cap_handle

        tracker = StreamForkTracker(is_capture, key=lambda s: s.cuda_stream)
        self._tracker = tracker

        def wait_stream(this, other):
            tracker.on_wait(this, other)
            return original(this, other)

        cls.wait_stream = wait_stream
        try:
            yield
        finally:
            cls.wait_stream = original
            self._tracker = None
