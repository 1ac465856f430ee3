"""Capture backends for upstream's decode / prefill runners (sglang glue).

They implement upstream's BaseCudaGraphBackend contract (capture_session / capture_one / can_run
/ replay_session / replay / cleanup), so upstream's runners keep owning buffers, padding,
attention metadata and output slicing:

- LayerwiseDecodeBackend: full graphs (upstream's FullCudaGraphBackend) for batch sizes at or
  below the full-graph ceiling, segmented layerwise graphs above it (or at every size).
- LayerwiseBreakablePrefillBackend (the default): upstream's breakable capture makes attention an
  eager break (upstream's own attention forward on the real tokens, the plan graphs disabled
  makes) and the MoE boundary adds itself as another one: the tokens of graphs disabled.
- LayerwisePrefillBackend (opt-in, SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=auto|fa2|fa3):
  FlashInfer can plan prefill attention into fixed buffers, so the attention stays inside the
  segments; subclassing FullCudaGraphBackend makes upstream's prefill runner use its
  fixed-request-slot ("full") path. Only the MoE is eager. Other kernels, other tokens.

Both modes: a `mode` of "warm" (eager forwards only; the runner's first capture pass, before the
traps are armed) or "capture" (the real pass, driven by runner.startup).
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Dict, Optional

import torch

from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import (
    BreakableCudaGraphBackend,
)
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import (
    FullCudaGraphBackend,
)

from .. import settings
from . import boundary, decode_attention, prefill_attention, zero_copy
from .boundary import CaptureSession, ProbeSession, StagingArena
from .config import resolved_cuda_graph_config
from .layerwise import LayerwiseEntry, SizeCapturer, capture_size, host_step_stats, is_oom
from .lean_moe import ENV as LEAN_MOE_ENV
from .lean_moe import PREFILL_CAP_ENV, LeanMoe, lean_moe_requested, lean_prefill_cap
from .memory import held_bytes, memory_delta, memory_point
from .segments import cuda_graph_factory

logger = logging.getLogger(__name__)

TIMING_ENV = "SGLANG_SM120_LAYERWISE_TIMING"
MOE_ROWS_ENV = "SGLANG_SM120_LAYERWISE_MOE_ROWS"
# Test hook, "SIZE" or "PHASE:SIZE": capturing that size fails with an OOM raised while its first
# segment is open (then the drop rule removes it and every larger size); for the GPU tests.
INJECT_OOM_ENV = "SGLANG_SM120_LAYERWISE_INJECT_OOM"
WARM_FORWARDS = 2  # eager forwards per size in the warm pass (upstream warms twice per size)


def _forward_flags_provider():
    """Snapshot sglang's per-forward flags (fuse_mlp_allreduce, mlp_reduce_scatter,
    is_extend_in_batch, ...) at capture; the eager MoE step re-enters them at replay."""
    from sglang.srt.runtime_context import get_forward

    flags = get_forward()
    values = {name: getattr(flags, name) for name in type(flags)._DEFAULTS}
    return lambda: flags.scoped(**values)


boundary.register_state_provider(_forward_flags_provider)


def _timing_enabled() -> bool:
    return settings.switch(TIMING_ENV)


def _oom_on_capture(forward_fn, size):
    calls = []

    def forward():
        calls.append(1)
        if len(calls) > 1:  # the warmup probe passes, the capture forward fails mid-capture
            raise torch.OutOfMemoryError(f"{INJECT_OOM_ENV}={size}: injected out-of-memory")
        return forward_fn()

    return forward


class _LayerwiseCommon:
    """State and helpers shared by the three backends (mixed into upstream classes)."""

    mode: str
    phase: str

    def _lw_init(self, runner, *, phase: str, capacity_rows: int, full_max_bs: int, lean: bool = False,
                 lean_max_rows: Optional[int] = None) -> None:
        self.mode = "warm"
        self.phase = phase
        self._runner = runner
        self._full_max_bs = full_max_bs
        self.arena = StagingArena(capacity_rows, runner.device)
        self.entries: Dict[Any, LayerwiseEntry] = {}
        self.capturer: Optional[SizeCapturer] = None
        self._current: Optional[tuple] = None
        self._timing = _timing_enabled()
        self.graph_factory = cuda_graph_factory  # tests inject a CPU emulator
        self._warm_oom: Optional[int] = None
        # per mode, when our last capture_one returned: the next call's start minus it is the
        # time upstream's capture loop spent on that size outside our code ("<mode>_gap_s")
        self._last_exit: Dict[str, float] = {}
        # wall seconds per size: the warm pass's forwards, the capture pass's probe and capture
        self.size_timings: Dict[int, Dict[str, float]] = {}
        # bytes per captured size, by kind (full / layerwise): memory_delta around its capture,
        # read only with the diagnostics switch (TIMING_ENV) on
        self.size_memory: Dict[int, Dict[str, Any]] = {}
        self.memory_accounting_s = 0.0  # spent reading it (not capture time: reported apart)
        self.lean: Optional[LeanMoe] = LeanMoe(runner.device, lean_max_rows) if lean else None
        self.zero_copy = bool(lean) and zero_copy.requested()
        self.real_rows = False  # decode sets it (MOE_ROWS_ENV): islands run on the replay's real rows
        self.attention_islands = False  # decode sets it (decode_attention.py)
        if lean:
            cap = "" if lean_max_rows is None else f", batches up to {lean_max_rows} tokens ({PREFILL_CAP_ENV})"
            logger.info("layerwise %s: lean eager MoE on (%s=0 turns it off%s)%s", phase, LEAN_MOE_ENV, cap,
                        f"; its steps read the segments' tensors in place ({zero_copy.ENV}=1)" if self.zero_copy else "")

    # -- helpers -------------------------------------------------------------------------------
    def _sync_barrier(self) -> None:
        self._device_module.synchronize()
        self._tp_group.barrier()

    def _agree(self, code: int) -> int:
        """The largest of every TP rank's `code` (a failure flag or SizeCapturer's outcome code),
        over the group's CPU (gloo) group; every rank must call it the same number of times."""
        group = self._tp_group
        if getattr(group, "world_size", 1) <= 1:
            return int(code)
        value = torch.tensor([int(code)], dtype=torch.int32)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX, group=group.cpu_group)
        return int(value.item())

    def _warm(self, size: int, forward_fn: Callable[[], Any], post_warmup_hook) -> None:
        t0 = time.perf_counter()
        failed = False
        for _ in range(WARM_FORWARDS):
            # every rank passes the same barriers, also one whose forward ran out of memory
            self._sync_barrier()
            if failed:
                continue
            try:
                forward_fn()
                if post_warmup_hook is not None:
                    post_warmup_hook()
            except Exception as e:  # noqa: BLE001
                if not is_oom(e):
                    raise
                failed = True
                logger.warning("layerwise %s: out of memory warming size %d: %s", self.phase, size, e)
        self.size_timings.setdefault(size, {})["warm_s"] = round(time.perf_counter() - t0, 4)
        if self._agree(failed):
            torch.cuda.empty_cache()
            self._warm_oom = min(size, self._warm_oom or size)

    def _pre_drop(self, capturer: SizeCapturer) -> SizeCapturer:
        """Sizes whose warm pass ran out of memory are dropped before capture (with the larger)."""
        if self._warm_oom:
            capturer.drop(self._warm_oom, "out of memory in the warm pass")
        return capturer

    def _capture_segments(self, size: int) -> None:
        key, forward_fn, post_warmup_hook = self._current
        if settings.text(INJECT_OOM_ENV) in (str(size), f"{self.phase}:{size}"):
            forward_fn = _oom_on_capture(forward_fn, size)
        self.entries[key] = capture_size(
            forward_fn,
            arena=self.arena,
            warmups=1,
            before_warmup=self._sync_barrier,
            post_warmup_hook=post_warmup_hook,
            before_capture=self._device_module.synchronize,
            graph_factory=self.graph_factory,
            pool=self._pool,
            stream=self._capture_stream,
            track_side_streams=self._capture_stream is not None,
            lean=self.lean,
            zero_copy=self.zero_copy,
            real_rows=self.real_rows,
            attention=self.attention_islands,
            timings=self.size_timings.setdefault(size, {}),
        )

    def _release(self, size: int) -> None:
        for store in (self.entries, getattr(self, "_graphs", {}), getattr(self, "_outputs", {})):
            for key in [k for k in store if getattr(k, "size", None) == size]:
                del store[key]

    # -- upstream's backend interface (first in each backend's MRO) ----------------------------
    def capture_one(self, shape_key, forward_fn, dummies=None, post_warmup_hook=None) -> None:
        """Upstream calls this once per size: in the warm pass it only runs the forward (for a
        breakable backend, capture_session has already switched attention to its break path);
        afterwards the SizeCapturer captures the size, full or layerwise, dropping it on OOM."""
        mode, entered = self.mode, time.perf_counter()
        if mode in self._last_exit:
            self.size_timings.setdefault(shape_key.size, {})[f"{mode}_gap_s"] = round(entered - self._last_exit[mode], 4)
        try:
            self._capture_one(shape_key, forward_fn, post_warmup_hook)
        finally:
            self._last_exit[mode] = time.perf_counter()

    def _capture_one(self, shape_key, forward_fn, post_warmup_hook) -> None:
        if self.mode == "warm":
            self._warm(shape_key.size, forward_fn, post_warmup_hook)
            return
        if self.capturer is None:
            self.capturer = self._new_capturer(self._capture_full)
        self._current = (shape_key, forward_fn, post_warmup_hook)
        # diagnostics only (TIMING_ENV): a device sync and an allocator snapshot around the capture
        pool = getattr(self, "_pool", None)
        t0 = time.perf_counter()
        before = memory_point(pool) if self._timing else None
        t1 = time.perf_counter()
        try:
            kind = self.capturer.capture(shape_key.size)
        finally:
            self._current = None
        if before is not None:
            t2 = time.perf_counter()
            if kind is not None:
                self.size_memory[shape_key.size] = dict(memory_delta(before, memory_point(pool)), kind=kind,
                                                        output_bytes=held_bytes(self._captured_output(shape_key)))
            self.memory_accounting_s += (t1 - t0) + (time.perf_counter() - t2)

    def _capture_full(self, size: int) -> None:
        raise AssertionError(f"{self.phase} never captures full graphs under layerwise")

    def _captured_output(self, shape_key) -> Any:
        """What a captured size hands back at replay (a full graph's output lives in upstream's
        store), for the memory readings."""
        entry = self.entries.get(shape_key)
        return entry.output if entry is not None else getattr(self, "_outputs", {}).get(shape_key)

    def cleanup(self) -> None:
        super().cleanup()
        self.entries.clear()
        self.capturer = None

    def _new_capturer(self, capture_full: Callable[[int], None]) -> SizeCapturer:
        planned = sorted(self._planned_sizes())
        return self._pre_drop(SizeCapturer(
            planned=planned,
            full_max_bs=self._full_max_bs,
            capture_full=capture_full,
            capture_layerwise=self._capture_segments,
            release=self._release,
            after_oom=torch.cuda.empty_cache,
            agree=self._agree,
            label=f"layerwise {self.phase}",
        ))

    def _planned_sizes(self):
        raise NotImplementedError

    def _replay_entry(self, entry: LayerwiseEntry) -> Any:
        if self._timing:
            entry.graph.replay_timed()
        else:
            entry.graph.replay()
        return entry.output

    # -- reporting -----------------------------------------------------------------------------
    def servable_sizes(self):
        return self.capturer.ledger.servable() if self.capturer is not None else []

    def report(self) -> Dict[str, Any]:
        out = self.capturer.summary() if self.capturer is not None else {}
        segs = [e.graph.num_segments for e in self.entries.values()]
        out.update(
            phase=self.phase,
            segments_per_size=max(segs) if segs else 0,
            graphs=sum(segs),  # instantiated segment graphs, every size
            staging_bytes=self.arena.nbytes,
            size_timings={str(k): v for k, v in sorted(self.size_timings.items())},
            size_memory={str(k): v for k, v in sorted(self.size_memory.items())},
            memory_accounting_s=round(self.memory_accounting_s, 4),
            moe_rows="real" if self.real_rows else "padded",
        )
        if self.phase == "decode":
            out["decode_attention"] = "eager" if self.attention_islands else "captured"
            out["attention_steps"] = sum(getattr(s, "attention", False)
                                         for e in self.entries.values() for s in e.graph.steps)
        if getattr(self, "rows_fallback", None):
            out["moe_rows_fallback"] = self.rows_fallback
        if self.lean is not None:
            steps = [s for e in self.entries.values() for s in e.graph.steps]
            out["lean_moe"] = dict(self.lean.summary(), **{
                f"{kind}_steps": sum(getattr(s, kind, False) for s in steps) for kind in ("lean", "zero_copy", "sm120")})
        return out

    def host_stats(self):
        return host_step_stats(self.entries)


class LayerwiseDecodeBackend(_LayerwiseCommon, FullCudaGraphBackend):
    def __init__(self, cuda_graph_runner, *, full_max_bs: int, enable_memory_saver: bool = False):
        FullCudaGraphBackend.__init__(self, cuda_graph_runner, enable_memory_saver=enable_memory_saver)
        width = int(getattr(cuda_graph_runner, "captured_req_width", 1) or 1)
        self._lw_init(
            cuda_graph_runner,
            phase="decode",
            capacity_rows=max(cuda_graph_runner.capture_bs) * width,
            full_max_bs=full_max_bs,
            lean=lean_moe_requested(),
        )
        self.real_rows = settings.choice(MOE_ROWS_ENV) == "real"
        self.rows_fallback: Optional[str] = None
        self._rows_warmed = False
        self.attention_islands = decode_attention.choose(
            cuda_graph_runner.model_runner, getattr(cuda_graph_runner, "attn_backend", None))
        self._real_batch = None  # the batch plan_real_batch planned for the next replay

    def _planned_sizes(self):
        return self._runner.capture_bs

    def _warm(self, size: int, forward_fn, post_warmup_hook) -> None:
        if self.real_rows and not self._rows_warmed:
            self._rows_warmed = True  # the first (largest) size: every smaller row count fits in it
            self._warm_every_row_count(size, forward_fn, post_warmup_hook)
        super()._warm(size, forward_fn, post_warmup_hook)

    def _warm_every_row_count(self, size: int, forward_fn, post_warmup_hook) -> None:
        """A replay runs the MoE on its real rows, any count from 1 to the largest size, and
        Triton specialises the MoE kernels on counts derived from it (and upstream picks the
        kernel config by it): record each distinct MoE island in one forward at this size and
        run it at every row count now, before the traps arm."""
        t0 = time.perf_counter()
        self._sync_barrier()
        recording, calls, error = boundary.RecordingSession(), 0, None
        try:
            with recording:
                forward_fn()
            if post_warmup_hook is not None:
                post_warmup_hook()
            # largest count first: the allocator's blocks freed by one count serve every smaller
            # one; counting up, each call's buffers outgrow every cached block and take new ones
            # (counting up, the first H200 run lost ~4.3 GB of free memory in this step, tiny model)
            calls = boundary.warm_rows(recording.kept, range(size, 0, -1), self.lean)
        except Exception as e:  # noqa: BLE001 - padded rows are warmed by the pass itself
            error = f"{type(e).__name__}: {e}"
        islands = len(recording.kept)
        recording.kept.clear()
        if self._agree(error is not None):
            # every rank falls back together (a step for real rows would compile at serving time)
            self.real_rows = False
            self.rows_fallback = error or "another rank could not warm every row count"
            torch.cuda.empty_cache()
            logger.warning("layerwise decode: running the MoE at every row count failed (%s); replays "
                           "run it on all rows of the captured size (%s=padded)", self.rows_fallback,
                           MOE_ROWS_ENV)
            return
        self._sync_barrier()
        self.size_timings.setdefault(size, {})["rows_warm_s"] = round(time.perf_counter() - t0, 4)
        logger.info("layerwise decode: %d distinct MoE island(s) run at every row count 1..%d (%d calls, "
                    "%.1f s): replays run the MoE on their real rows (%s=real)",
                    islands, size, calls, time.perf_counter() - t0, MOE_ROWS_ENV)

    def _capture_full(self, size: int) -> None:
        key, forward_fn, post_warmup_hook = self._current
        FullCudaGraphBackend.capture_one(self, key, forward_fn, None, post_warmup_hook)

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self.entries or shape_key in self._graphs

    def plan_real_batch(self, shape_key, forward_batch, attn_backend) -> None:
        """Called by the runner's load_batch (before the read-done event a replay publishes):
        a size with attention islands gets graphs disabled's plan for the real batch."""
        entry = self.entries.get(shape_key)
        if entry is None or not entry.attention:
            self._real_batch = None
            return
        attn_backend.init_forward_metadata(forward_batch)  # graphs disabled's plan for this batch
        self._real_batch = forward_batch

    def replay(self, shape_key, static_forward_batch, **kwargs) -> Any:
        entry = self.entries.get(shape_key)
        if entry is not None:
            # the runner's load_batch has set the unpadded token count of this batch
            rows = getattr(self._runner, "raw_num_token", None) if self.real_rows else None
            batch = self._real_batch if entry.attention else None
            if entry.attention and batch is None:
                raise RuntimeError("layerwise decode: a size with attention islands replayed without "
                                   "plan_real_batch (the runner's load_batch)")
            previous = boundary.set_replaying_rows(rows), boundary.set_replaying_batch(batch)
            try:
                return self._replay_entry(entry)
            finally:
                boundary.set_replaying_rows(previous[0])
                boundary.set_replaying_batch(previous[1])
                self._real_batch = None
        return FullCudaGraphBackend.replay(self, shape_key, static_forward_batch, **kwargs)


class LayerwisePrefillBackend(_LayerwiseCommon, FullCudaGraphBackend):
    """Captured-attention prefill (FlashInfer): every bucket layerwise, attention in-graph."""

    def __init__(self, cuda_graph_runner, *, enable_memory_saver: bool = False):
        FullCudaGraphBackend.__init__(self, cuda_graph_runner, enable_memory_saver=enable_memory_saver)
        # Lean MoE steps only up to a token cap: the workspace is sized by the largest bucket
        # that gets them, and host time matters less the more tokens a step carries.
        cap = lean_prefill_cap() if lean_moe_requested() else 0
        self._lw_init(
            cuda_graph_runner,
            phase="prefill",
            capacity_rows=max(cuda_graph_runner.capture_num_tokens),
            full_max_bs=0,
            lean=cap > 0,
            lean_max_rows=cap,
        )

    def _planned_sizes(self):
        return self._runner.capture_num_tokens

    @contextlib.contextmanager
    def capture_session(self, stream):
        # the fixed-slot attention wrappers are built inside the first session (the warm pass)
        attn = getattr(self._runner.model_runner, "attn_backend", None)
        with prefill_attention.wrappers_built_with(attn), FullCudaGraphBackend.capture_session(self, stream):
            yield

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self.entries

    def replay(self, shape_key, static_forward_batch, **kwargs) -> Any:
        return self._replay_entry(self.entries[shape_key])


class _BreakableCutter:
    """`cut(step)` onto upstream's BreakableCUDAGraphCapture (same sequence its eager_on_graph
    wrapper performs, minus running the wrapped function during capture)."""

    def __init__(self, capture):
        self._capture = capture

    def cut(self, step) -> None:
        self._capture._end_current_segment()
        self._capture.cuda_graph._break_fns.append(step)
        self._capture._begin_new_segment()


class LayerwiseBreakablePrefillBackend(_LayerwiseCommon, BreakableCudaGraphBackend):
    """Attention-break prefill: upstream's breakable capture plus the MoE as a second break."""

    def __init__(self, cuda_graph_runner, *, enable_memory_saver: bool = False, debug_eager: bool = False):
        BreakableCudaGraphBackend.__init__(
            self, cuda_graph_runner, enable_memory_saver=enable_memory_saver, debug_eager=debug_eager
        )
        self._lw_init(
            cuda_graph_runner,
            phase="prefill",
            capacity_rows=max(cuda_graph_runner.capture_num_tokens),
            full_max_bs=0,
        )
        self._records = []

    def _planned_sizes(self):
        return self._runner.capture_num_tokens

    def _capture_segments(self, size: int) -> None:
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
            _current_capture_var,
        )

        key, forward_fn, post_warmup_hook = self._current

        def islanded_forward():
            active = _current_capture_var.get()
            if active is None:  # one of upstream's warmup forwards: probe the islands
                self._records = []
                with ProbeSession(self.arena, self._records):
                    return forward_fn()
            with CaptureSession(self.arena, self._records, _BreakableCutter(active)):
                return forward_fn()

        BreakableCudaGraphBackend.capture_one(self, key, islanded_forward, None, post_warmup_hook)

    def can_run(self, forward_batch, shape_key) -> bool:
        return shape_key in self._graphs


def _attention_plans_fixed_prefill(attn_backend) -> bool:
    """FlashInfer's MHA backend can plan EXTEND into capture-stable wrappers (upstream's
    full-prefill path); MLA and other backends cannot."""
    return hasattr(attn_backend, "_create_full_cg_prefill_wrappers") and type(
        attn_backend
    ).__name__ == "FlashInferAttnBackend"


def make_decode_backend(cuda_graph_runner) -> LayerwiseDecodeBackend:
    sa = cuda_graph_runner.model_runner.server_args
    full_max_bs = resolved_cuda_graph_config(sa).decode.layerwise_full_max_bs
    return LayerwiseDecodeBackend(
        cuda_graph_runner,
        full_max_bs=int(full_max_bs or 0),
        enable_memory_saver=sa.enable_memory_saver,
    )


def make_prefill_backend(cuda_graph_runner):
    mr = cuda_graph_runner.model_runner
    captured = prefill_attention.captured_requested()
    if captured and _attention_plans_fixed_prefill(mr.attn_backend):
        return LayerwisePrefillBackend(cuda_graph_runner, enable_memory_saver=mr.server_args.enable_memory_saver)
    if captured:
        logger.info(
            "layerwise prefill: %s cannot plan prefill attention into fixed buffers (%s=%s asks for "
            "captured attention); attention runs as an eager break like the MoE",
            type(mr.attn_backend).__name__, prefill_attention.ENV, prefill_attention.requested(),
        )
    else:
        logger.info("layerwise prefill: attention runs as an eager break with %s's own forward "
                    "(%s=eager; auto|fa2|fa3 capture it, other tokens)",
                    type(mr.attn_backend).__name__, prefill_attention.ENV)
    return LayerwiseBreakablePrefillBackend(
        cuda_graph_runner,
        enable_memory_saver=mr.server_args.enable_memory_saver,
        debug_eager=mr.server_args.debug_cuda_graph,
    )
