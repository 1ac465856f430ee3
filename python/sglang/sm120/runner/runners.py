"""Upstream's decode / prefill runners with deferred capture and eager-fallback logging.

Upstream captures inside each runner's constructor, prefill before decode. Layerwise needs every
size of both phases warmed (JIT compiles, autotuning, version probes) before the first graph is
captured, so that the traps can be armed for the whole capture. So the first `capture()` (from
the constructor) runs the runner's own capture loop with the backend in "warm" mode (eager
forwards at every size, through exactly the code path the capture will take), and
`finish_layerwise_capture()` (from runner.startup, once both runners exist) runs it again for
real. Until then, and for sizes that were dropped or not planned, batches run eagerly, with one
log line per size.
"""
from __future__ import annotations

import atexit
import json
import logging
import sys
import time

import torch

from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner
from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode

from . import startup
from .layerwise import EagerFallbackLog, describe_sizes
from .memory import memory_delta, memory_point
from .sizes import pad_to_bucket

logger = logging.getLogger(__name__)

CAPTURE_TAG = "SM120_LAYERWISE_CAPTURE"
HOST_TAG = "SM120_LAYERWISE_HOST"


class _DeferredCaptureMixin:
    _lw_started = False
    _lw_finished = False

    def _lw_capture(self, real_capture) -> None:
        if not self._lw_started:
            self.backend.mode = "warm"
            real_capture()
            self._lw_warm_eager_paths()
            startup.register(self.model_runner, self)
            return
        self.backend.mode = "capture"
        real_capture()

    def _lw_finish(self, run) -> None:
        self._lw_started = True
        tic = time.perf_counter()
        before = memory_point(None)
        run()
        after = memory_point(None)
        self._lw_finished = True
        self._lw_apply_servable()
        report = self.backend.report()
        # graph memory split: torch's allocator (pool and eager caches) vs outside it, per graph;
        # elapsed without the per-size memory readings (their time is in memory_accounting_s)
        taken = memory_delta(before, after)
        elapsed = time.perf_counter() - tic - report.get("memory_accounting_s", 0.0)
        report.update(elapsed_s=round(elapsed, 3), mem_bytes=before["free"] - after["free"],
                      allocator_bytes=taken["reserved"], outside_allocator_bytes=taken["outside"])
        logger.info(
            "layerwise %s capture: %.2f s, %.3f GB; full %s, layerwise %s, dropped %s, "
            "%d segments per layerwise size, staging %.1f MB",
            report["phase"], report["elapsed_s"], report["mem_bytes"] / 2**30,
            describe_sizes(report.get("full", [])), describe_sizes(report.get("layerwise", [])),
            report.get("dropped", []), report["segments_per_size"], report["staging_bytes"] / 2**20,
        )
        print(f"{CAPTURE_TAG} {json.dumps(report)}", file=sys.stderr, flush=True)
        if self.backend._timing:
            atexit.register(self._lw_print_host_stats)

    def _lw_print_host_stats(self) -> None:
        stats = [
            dict({"size": getattr(k, "size", k), "step_host_us": round(s * 1e6, 2), "step_cpu_us": round(c * 1e6, 2),
                  "replays": n}, **({} if a is None else {"attention_step_host_us": round(a * 1e6, 2)}))
            for k, s, c, n, a in self.backend.host_stats()
        ]
        print(
            f"{HOST_TAG} {json.dumps({'phase': self.backend.phase, 'sizes': stats})}",
            file=sys.stderr,
            flush=True,
        )

    def _lw_servable(self):
        return self.backend.servable_sizes()

    def _lw_warm_eager_paths(self) -> None:
        """Eager code paths that serve the batches graphs cannot take (warmed before the traps
        arm, so a fallback does not JIT-compile at serving time)."""


class LayerwiseDecodeRunner(_DeferredCaptureMixin, DecodeCudaGraphRunner):
    phase = "decode"

    def __init__(self, model_runner, **kwargs):
        self._lw_eager_log = EagerFallbackLog("decode")
        super().__init__(model_runner, **kwargs)

    def capture(self) -> None:
        self._lw_capture(super().capture)

    def finish_layerwise_capture(self) -> None:
        def run():
            with model_capture_mode():
                self.capture()

        self._lw_finish(run)

    def capture_one_shape(self, size, forward, stream_idx=None, *args, **kwargs):
        super().capture_one_shape(size, forward, stream_idx, *args, **kwargs)
        if self.backend.mode == "warm":
            self._lw_warm_replay_paths(size, stream_idx)

    def load_batch(self, forward_batch, *args, **kwargs):
        out = super().load_batch(forward_batch, *args, **kwargs)
        # inside load_batch: before the read-done event the replay publishes (the plan reads
        # req_to_token), where upstream plans its captured metadata
        self.backend.plan_real_batch(self._replay_graph_key, forward_batch, self.attn_backend)
        return out

    def _lw_warm_replay_paths(self, size: int, stream_idx) -> None:
        """Run, once at this size in the warm pass, what a replay runs outside the graphs, so
        nothing of it compiles after the traps arm:

        - the attention backend's replay-time metadata step. Upstream calls
          `init_forward_metadata_out_graph(in_capture=True)` once per size while capturing and the
          replay variant (in_capture=False) before every replay. Backends that keep per-size
          metadata (DSA) only build it on the capture call and run their replay kernel (DSA: a
          Triton kernel specialised on the batch size) from the next call on;
        - at a layerwise size with attention islands, graphs disabled's plan for the batch and
          the attention on it (one eager forward on the dummy batch)."""
        num_tokens = size * self.captured_req_width
        bs = self._ragged_capture_slots(num_tokens) if self.ragged_verify_mode else size
        forward_batch, attn_backend, _ = self.capture_prepare(bs, stream_idx=stream_idx, num_tokens=num_tokens)
        with forward_context(ForwardContext(attn_backend=attn_backend)):
            attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=False)
            if not (self.backend.attention_islands and size > self.backend._full_max_bs):
                return
            try:
                self.device_module.synchronize()
                with torch.inference_mode():
                    attn_backend.init_forward_metadata(forward_batch)
                    self.model_runner.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
                self.device_module.synchronize()
            except Exception as e:  # noqa: BLE001 - said; a replay may then build what it needs
                logger.warning("layerwise decode: could not warm attention on the real batch at size %d: %s: %s",
                               size, type(e).__name__, e)

    def _lw_apply_servable(self) -> None:
        sizes = self._lw_servable()
        if sizes:
            self.capture_bs = sizes
            self.max_bs = max(sizes)

    def can_run_graph(self, forward_batch) -> bool:
        bs = forward_batch.batch_size
        if not self._lw_finished or not self.capture_bs:
            self._lw_eager_log.note(bs, "layerwise decode graphs are not captured")
            return False
        ok = super().can_run_graph(forward_batch)
        if not ok:
            padded = pad_to_bucket(bs, self.capture_bs)
            reason = (
                f"above the largest captured batch size {self.capture_bs[-1]}"
                if padded is None
                else "the batch is not graphable (upstream check)"
            )
            self._lw_eager_log.note(bs, reason)
        return ok


class LayerwisePrefillRunner(_DeferredCaptureMixin, PrefillCudaGraphRunner):
    phase = "prefill"

    def __init__(self, model_runner, **kwargs):
        self._lw_eager_log = EagerFallbackLog("prefill")
        super().__init__(model_runner, **kwargs)

    def capture(self) -> None:
        self._lw_capture(super().capture)

    def finish_layerwise_capture(self) -> None:
        self._lw_finish(self.capture)

    def _uses_eager_prefill_tail(self) -> bool:
        # Upstream decides this from the backend *name* (breakable / full). Both layerwise
        # prefill backends subclass those and must take the same path: capture the transformer
        # body only (layer_model.forward) and run LM head + logits processor eagerly on the real
        # batch. Otherwise the name 'layerwise' selects the tc_piecewise path: the LM head and
        # logits processor would be captured with the dummy batch's request slots (other GEMM
        # shapes than eager, so other rounding and different first tokens), and every
        # return_logprob prefill would silently run eagerly.
        return True

    def _lw_warm_eager_paths(self) -> None:
        # A prefill with more requests than request slots runs eagerly, with the attention
        # backend's eager (e.g. FlashInfer ragged) plan: run that path at every bucket size once.
        # (Attention-break mode: its warm pass already ran attention eagerly at every bucket.)
        if self._is_full_backend:
            for num_tokens in sorted(self.capture_num_tokens, reverse=True):
                self._run_dummy_forward(num_tokens)
        self._lw_warm_prefix_extend()
        self.device_module.synchronize()

    PREFIX_WARM_TOKENS = 16

    def _lw_warm_prefix_extend(self) -> None:
        """An extend over a cached prefix (a radix-cache hit, a later chunk of a chunked prefill)
        runs attention another way than the warm pass's batches, which have none: FlashInfer plans
        a paged prefill over the prefix beside the ragged one over the new tokens and merges them
        (flashinfer.cascade.merge_state), other JIT modules. Run one such extend eagerly (request
        slot 0 extends the smallest bucket over a prefix of PREFIX_WARM_TOKENS tokens, all of
        them KV slot 0, the pool's padding slot) so they load before the traps arm."""
        try:
            n, p = min(self.capture_num_tokens), self.PREFIX_WARM_TOKENS
            fb, attn_backend = self.capture_prepare(n)
            fb.seq_lens[0] += p
            if fb.orig_seq_lens is not None:
                fb.orig_seq_lens[0] += p
            fb.seq_lens_cpu[0] += p
            fb.seq_lens_sum += p
            fb.extend_prefix_lens[0] = p
            fb.extend_prefix_lens_cpu = [p] + [0] * (fb.batch_size - 1)
            attn_backend.init_forward_metadata(fb)
            self._run_forward(fb, n)
        except Exception as e:  # noqa: BLE001 - best effort, like runner/prewarm.py
            logger.warning("layerwise prefill: could not warm an extend over a cached prefix: %s: %s",
                           type(e).__name__, e)

    def _lw_apply_servable(self) -> None:
        sizes = self._lw_servable()
        if sizes:
            self.capture_num_tokens = sizes
            self.max_num_tokens = max(sizes)

    def can_run_graph(self, forward_batch) -> bool:
        n = len(forward_batch.input_ids) if forward_batch.input_ids is not None else 0
        if not self._lw_finished or not self.capture_num_tokens:
            self._lw_eager_log.note(n, "layerwise prefill graphs are not captured")
            return False
        ok = super().can_run_graph(forward_batch)
        if not ok:
            self._lw_eager_log.note(n, self._why_eager(forward_batch, n))
        return ok

    def _why_eager(self, forward_batch, n: int) -> str:
        if self._is_full_backend and forward_batch.batch_size > self._capture_req_slots:
            return f"{forward_batch.batch_size} requests > {self._capture_req_slots} request slots"
        padded = pad_to_bucket(n, self.capture_num_tokens)
        if padded is None:
            return f"above the largest captured bucket {self.capture_num_tokens[-1]} tokens"
        if padded > 2 * n:
            return f"padding {n} tokens to bucket {padded} would more than double the work"
        return "the batch is not graphable (upstream check)"
