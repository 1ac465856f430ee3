"""Capturing one size layerwise, and the per-runner loop policy around it.

`capture_size` = warmup forwards under a ProbeSession, then one forward under a CaptureSession
inside a SegmentCapture. `SizeCapturer` drives sizes largest first: full graphs at or below the
ceiling (through a callback into upstream's full backend), layerwise above it, full->layerwise
fallback when the MoE turns out not to be capturable, and OOM drops (the size and every larger
one). No sglang imports: the sglang glue passes callables in, which keeps this testable on CPU.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..traps import TrapViolation
from .boundary import ATTENTION, CaptureSession, ProbeRecord, ProbeSession, StagingArena
from .segments import GraphFactory, SegmentCapture, SegmentedGraph, cuda_graph_factory
from .sizes import SizeLedger

logger = logging.getLogger(__name__)


@dataclass
class LayerwiseEntry:
    graph: SegmentedGraph
    output: Any
    islands: int
    attention: bool = False  # decode attention islands: replays need the real batch planned


def capture_size(
    forward_fn: Callable[[], Any],
    *,
    arena: StagingArena,
    warmups: int = 1,
    before_warmup: Optional[Callable[[], None]] = None,
    post_warmup_hook: Optional[Callable[[], None]] = None,
    before_capture: Optional[Callable[[], None]] = None,
    graph_factory: GraphFactory = cuda_graph_factory,
    pool=None,
    stream=None,
    track_side_streams: bool = False,
    lean=None,
    zero_copy: bool = False,
    real_rows: bool = False,
    attention: bool = False,
    timings: Optional[Dict[str, float]] = None,
) -> LayerwiseEntry:
    """Warm up (eager, recording every eager island) and capture one size as segments.

    warmups: eager forwards before the capture; the last one's island records are used.
    before_warmup: e.g. device sync + TP barrier, called before every warmup forward.
    post_warmup_hook: lets the attention backend reset state a warmup mutated.
    before_capture: e.g. device sync, called once right before the first segment opens.
    lean: a lean_moe.LeanMoe: islands whose lean step matched upstream's in the last warmup
        become lean steps.
    zero_copy: lean steps read the segment's own tensors, not staged copies (zero_copy.py).
    real_rows: steps run the MoE on the replay's real rows (boundary.set_replaying_rows).
    attention: decode attention calls are islands too, run at replay on the real batch
        (boundary.set_replaying_batch).
    timings: filled with probe_s (the warmup forwards) and capture_s (the captured forward,
        instantiation included), wall seconds: where a size's capture time goes.
    """
    if warmups < 1:
        raise ValueError("capture_size needs at least one warmup forward to probe eager islands")
    records: List[ProbeRecord] = []
    t0 = time.perf_counter()
    for _ in range(warmups):
        records = []
        if before_warmup is not None:
            before_warmup()
        with ProbeSession(arena, records, lean, attention):
            forward_fn()
        if post_warmup_hook is not None:
            post_warmup_hook()
    if before_capture is not None:
        before_capture()
    t1 = time.perf_counter()
    graph = SegmentedGraph()
    with SegmentCapture(
        graph,
        graph_factory=graph_factory,
        pool=pool,
        stream=stream,
        track_side_streams=track_side_streams,
    ) as cap, CaptureSession(arena, records, cap, lean, zero_copy=zero_copy,
                             real_rows=real_rows, attention=attention):
        output = forward_fn()
    if timings is not None:
        timings.update(probe_s=round(t1 - t0, 4), capture_s=round(time.perf_counter() - t1, 4))
    return LayerwiseEntry(graph=graph, output=output, islands=len(records),
                          attention=any(r.kind == ATTENTION for r in records))


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# A rank's outcome of one capture; agree() takes the largest over the ranks, so an out-of-memory
# anywhere drops the size everywhere, and an uncapturable full graph anywhere makes it layerwise.
CAPTURED, FULL_FAILED, OUT_OF_MEMORY = 0, 1, 2


@dataclass
class SizeCapturer:
    """Capture policy for one runner's sizes (call `capture(size)` largest first).

    full_max_bs: sizes <= this go through `capture_full` (upstream full graph); 0 = none.
    capture_full(size): record a full graph for `size` (raises on failure).
    capture_layerwise(size): record a segmented graph for `size` (raises on failure).
    release(size): forget the graphs of a captured size (after an OOM further down).
    after_oom(): free cached memory after an OOM.
    agree(code): the largest of every tensor-parallel rank's outcome code (identity on one
        rank); called the same number of times on every rank, so every rank captures each size
        the same way: the same graph kind (a full graph and a layerwise one differ in where the
        collectives run) and the same dropped sizes.
    """

    planned: List[int]
    full_max_bs: int
    capture_full: Callable[[int], None]
    capture_layerwise: Callable[[int], None]
    release: Callable[[int], None]
    after_oom: Callable[[], None] = lambda: None
    agree: Callable[[int], int] = lambda code: code
    label: str = "layerwise"
    ledger: SizeLedger = field(init=False)
    moe_capturable: bool = True
    kinds: Dict[int, str] = field(default_factory=dict)
    fallback_reason: Optional[str] = None

    def __post_init__(self):
        self.ledger = SizeLedger(planned=sorted(self.planned))

    def order(self) -> List[int]:
        return self.ledger.capture_order()

    def wants_full(self, size: int) -> bool:
        return self.moe_capturable and size <= self.full_max_bs

    def capture(self, size: int) -> Optional[str]:
        """Capture `size`; returns 'full', 'layerwise' or None when it was dropped."""
        if self.ledger.is_dropped(size):
            return None
        kind = "full" if self.wants_full(size) else "layerwise"
        code, error = self._attempt(size, full=kind == "full")
        agreed = self.agree(code)
        if agreed == FULL_FAILED:
            # The MoE (or something next to it) is not capturable on some rank: from here on
            # every size is layerwise on every rank, which is exactly what layerwise exists for.
            if code == CAPTURED:  # this rank has a full graph for `size`, another rank could not
                self.release(size)
            self.moe_capturable = False
            self.fallback_reason = (f"{type(error).__name__}: {error}" if error is not None
                                    else "full-graph capture failed on another rank")
            logger.warning(
                "%s: full-graph capture of size %d failed (%s); capturing this and "
                "all remaining sizes layerwise",
                self.label, size, self.fallback_reason,
            )
            kind = "layerwise"
            code, error = self._attempt(size, full=False)
            agreed = self.agree(code)
        if agreed == OUT_OF_MEMORY:
            if code == CAPTURED:  # this rank captured it, another rank did not
                self.release(size)
            why = f"{type(error).__name__}: {error}" if error is not None else "another rank ran out of memory"
            self.drop(size, why)
            return None
        self.ledger.mark_captured(size)
        self.kinds[size] = kind
        return kind

    def _attempt(self, size: int, full: bool):
        """(outcome code, the exception) of one capture on this rank; re-raises what is neither an
        out-of-memory nor, for a full graph, an uncapturable forward (a trap, a bug)."""
        try:
            (self.capture_full if full else self.capture_layerwise)(size)
            return CAPTURED, None
        except Exception as e:  # noqa: BLE001 - classified below
            if is_oom(e):
                return OUT_OF_MEMORY, e
            if full and not isinstance(e, TrapViolation):
                return FULL_FAILED, e
            raise

    def drop(self, size: int, why: str) -> None:
        """Drop `size` and every larger size (releasing captured ones); they run eagerly."""
        self.after_oom()
        captured_before = set(self.ledger.captured)
        newly = self.ledger.drop_from(size)
        for s in newly:
            if s in captured_before:
                self.release(s)
                self.kinds.pop(s, None)
        self.after_oom()
        logger.warning(
            "%s: size %d could not be captured (%s); dropped sizes %s, they run eagerly",
            self.label, size, why, newly,
        )

    def summary(self) -> Dict[str, Any]:
        full = sorted(s for s, k in self.kinds.items() if k == "full")
        lw = sorted(s for s, k in self.kinds.items() if k == "layerwise")
        return {
            "full": full,
            "layerwise": lw,
            "dropped": sorted(self.ledger.dropped),
            "moe_capturable": self.moe_capturable,
            "fallback_reason": self.fallback_reason,
        }


def describe_sizes(sizes: List[int], limit: int = 12) -> str:
    if len(sizes) <= limit:
        return str(sizes)
    return f"[{', '.join(map(str, sizes[:limit // 2]))}, ..., {', '.join(map(str, sizes[-limit // 2:]))}] ({len(sizes)} sizes)"


class EagerFallbackLog:
    """One log line per (phase, size) that runs eagerly instead of replaying a graph."""

    def __init__(self, phase: str, log: Callable[[str], None] = logger.warning):
        self.phase = phase
        self._seen: set = set()
        self._log = log

    def note(self, size: int, reason: str) -> bool:
        key = (size, reason)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._log(f"layerwise {self.phase}: size {size} runs eagerly ({reason}); logged once")
        return True


def host_step_stats(entries: Dict[Any, LayerwiseEntry]) -> List[Tuple[Any, float, float, int, Optional[float]]]:
    """(key, mean wall seconds per eager MoE step, mean CPU seconds per eager MoE step, replays,
    mean wall seconds per decode attention step or None) for entries replayed with timing."""
    out = []
    for key, e in entries.items():
        g = e.graph
        attention = sum(getattr(s, "attention", False) for s in g.steps)
        moe = len(g.steps) - attention
        if g.timed_replays and moe:
            n = g.timed_replays * moe
            att = g.attention_host_seconds / (g.timed_replays * attention) if attention else None
            out.append((key, g.step_host_seconds / n, g.step_cpu_seconds / n, g.timed_replays, att))
    return out
