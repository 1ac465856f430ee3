"""Warm what the serving path JIT-compiles outside the model forward, before the traps arm.

The runners' warm pass covers every captured forward. These run outside it on the first
requests and would JIT-compile (a compiler subprocess) after capture:
  - sampling: with sglang's default sampling backend (FlashInfer) the first non-greedy request
    builds the sampling kernels; each entry point sglang uses runs once here;
  - the extend batch's positions (Triton `compute_position_kernel`, from ForwardBatch.init_new:
    the runners' dummy batches are built without it, so the server's own warm-up request
    compiled it after capture on a cold cache; one kernel per `has_prefix`);
  - the decode batch's positions (upstream's JIT `clamp_position`, also from ForwardBatch.init_new:
    the captured decode forward never builds a ForwardBatch, so the first real decode built it
    after capture on a cold cache: ninja, caught by the strict traps on the H100, session
    2026-12-05b); one module per `seq_lens` dtype, so int32 and int64 are both built;
  - the scheduler's KV-index write for extend batches (Triton `write_req_to_token_pool_triton`):
    Triton specialises on 16-byte pointer alignment, and `out_cache_loc` is
    a slice of the allocator's free list at any offset, so both alignments are built;
  - FlashInfer's KV-index build (Triton `create_flashinfer_kv_indices_triton`) for batches that
    run eagerly (sizes outside the captured set): the eager path passes
    int64 request/length tensors where the captured path's buffers may be int32, and Triton
    compiles per dtype and per None-ness of `kv_start_idx`, so every combination is built.
  - the scheduler's paged KV allocation (page size > 1, e.g. DSA's 64): upstream's Triton
    `alloc_extend_kernel` / `alloc_decode_kernel` take next_power_of_2(batch size) as a constexpr,
    so each power of two up to the request limit is its own kernel, per `last_loc` dtype (an
    int32 row of req_to_token in decode, int32 or int64 prefix indices in extend).
  - the DSA indexer's prefill key gather (0.5.16's Triton `_get_k_and_s_triton`): per power of
    two of the batch's request count and per page-table width class;
  - FlashInfer's MLA backend plans its ragged prefill (MHA over the new tokens) only on the first
    extend, which loads (and on a host without the module, compiles: ninja) the prefill module.
  - FlashInfer's cascade module (`merge_state`): an extend over a cached prefix (a radix-cache
    hit, the later chunks of a chunked prefill) merges the ragged attention over the new tokens
    with the paged one over the prefix; the runners' dummy batches have no prefix.
FlashInfer loads a JIT module by running ninja (a subprocess, even when the library is up to
date), so each module is loaded in the scheduler process before the traps arm. The sampling and
cascade modules take minutes to build on a cold cache and nothing else needs them, so
`start_background_builds` builds them on a thread while the runners' warm passes run (upstream's
configuration builds the sampling module only at the first non-greedy request), and
`join_background_builds` waits for it before the traps arm.
Best effort: a failure is logged, never fatal (the trap would then name what still compiles).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import List, Optional

import torch

logger = logging.getLogger(__name__)

_BUILDER: Optional[threading.Thread] = None
_BUILT: List[str] = []


def _flashinfer_modules(server_args) -> List[str]:
    """The FlashInfer JIT modules serving may reach outside the captured forwards."""
    names = []
    if getattr(server_args, "sampling_backend", None) == "flashinfer":
        names.append("sampling")
    if _uses_flashinfer(server_args):
        names.append("cascade")
    return names


def _build(names: List[str]) -> None:
    for name in names:
        tic = time.perf_counter()
        try:
            if name == "sampling":
                from flashinfer.sampling import get_sampling_module as get
            else:
                from flashinfer.cascade import get_cascade_module as get
            get()
            _BUILT.append(name)
            logger.info("layerwise: FlashInfer %s module loaded in %.1f s (background)", name,
                        time.perf_counter() - tic)
        except Exception as e:  # noqa: BLE001 - the foreground warm-ups try again
            logger.warning("layerwise: could not build FlashInfer's %s module in the background: %s", name, e)


def start_background_builds(server_args) -> None:
    """Build (JIT-compile and load) FlashInfer's sampling and cascade modules on a thread, once per
    process: they need no GPU work, and on a cold cache they take minutes that would otherwise
    add to the start-up after the warm passes."""
    global _BUILDER
    if _BUILDER is not None:
        return
    names = _flashinfer_modules(server_args)
    if not names:
        return
    _BUILDER = threading.Thread(target=_build, args=(names,), name="sm120-flashinfer-jit", daemon=True)
    _BUILDER.start()


def join_background_builds() -> None:
    """Wait for the background builds (before the traps arm: a build spawns ninja)."""
    if _BUILDER is None or not _BUILDER.is_alive():
        return
    tic = time.perf_counter()
    _BUILDER.join()
    logger.info("layerwise: waited %.1f s for FlashInfer's background module builds", time.perf_counter() - tic)


def warm_sampling(model_runner) -> None:
    if getattr(model_runner.server_args, "sampling_backend", None) != "flashinfer":
        return
    try:
        from sglang.srt.layers import sampler as S

        device = model_runner.device
        vocab = int(model_runner.model_config.vocab_size)
        probs = torch.softmax(torch.randn(2, vocab, device=device), dim=-1)
        top_ks = torch.full((2,), 8, dtype=torch.int32, device=device)
        top_ps = torch.full((2,), 0.9, dtype=torch.float32, device=device)
        min_ps = torch.full((2,), 0.05, dtype=torch.float32, device=device)
        S.top_k_top_p_sampling_from_probs(probs, top_ks, top_ps, filter_apply_order="joint")
        renormed = S.top_p_renorm_prob(S.top_k_renorm_prob(probs, top_ks), top_ps)
        S.min_p_sampling_from_probs(renormed, min_ps)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build FlashInfer sampling kernels: %s", e)


def warm_merge_state(model_runner) -> None:
    """Run FlashInfer's merge_state once (loads the cascade module in this process): the eager
    extend over a cached prefix calls it (FlashInferAttnBackend.forward_extend)."""
    if not _uses_flashinfer(getattr(model_runner, "server_args", None)):
        return
    try:
        from flashinfer.cascade import merge_state

        device = model_runner.device
        v = torch.zeros(1, 1, 64, dtype=torch.bfloat16, device=device)
        s = torch.zeros(1, 1, dtype=torch.float32, device=device)
        merge_state(v, s, v, s)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-load FlashInfer's cascade module (merge_state): %s", e)


def warm_kv_index_writes(model_runner) -> None:
    try:
        from sglang.sm120 import upstream_api

        write_req_to_token_pool_triton = upstream_api.require("write_req_to_token_pool_triton")
        support_triton = upstream_api.require("support_triton")

        server_args = getattr(model_runner, "server_args", None)
        if server_args is None or not support_triton(server_args.attention_backend):
            return
        req_to_token = model_runner.req_to_token_pool.req_to_token
        device = req_to_token.device
        zeros = lambda: torch.zeros(1, dtype=torch.int64, device=device)  # noqa: E731
        prefix = zeros()
        pointers = torch.tensor([prefix.data_ptr()], dtype=torch.uint64, device=device)
        locs = torch.zeros(4, dtype=torch.int64, device=device)
        for out_cache_loc in (locs, locs[1:]):  # 16-byte aligned and not
            # prefix and extend lengths 0: the kernel writes nothing into the pool
            write_req_to_token_pool_triton[(1,)](
                req_to_token, zeros(), pointers, zeros(), zeros(), zeros(), out_cache_loc,
                req_to_token.shape[1],
            )
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build the KV-index write kernel: %s", e)


def warm_extend_positions(model_runner) -> None:
    server_args = getattr(model_runner, "server_args", None)
    try:
        from sglang.sm120 import upstream_api

        support_triton = upstream_api.require("support_triton")
        if server_args is None or not support_triton(server_args.attention_backend):
            return
        compute_position_triton = upstream_api.require("compute_position_triton")
        device = torch.device(model_runner.device)
        seq_lens = torch.ones(2, dtype=torch.int32, device=device)
        for prefix_lens in (torch.zeros(2, dtype=torch.int32, device=device),  # has_prefix
                            torch.zeros(0, dtype=torch.int32, device=device)):  # and not
            compute_position_triton(prefix_lens, seq_lens, 2)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build the extend positions kernel: %s", e)


def warm_decode_positions(model_runner) -> None:
    try:
        from sglang.sm120 import upstream_api

        clamp_position = upstream_api.require("forward_batch_info.clamp_position")
        device = torch.device(model_runner.device)
        for dtype in (torch.int32, torch.int64):
            clamp_position(torch.ones(2, dtype=dtype, device=device))
        if device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build the decode positions kernel: %s", e)


def _uses_flashinfer(server_args) -> bool:
    names = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")
    return server_args is not None and any(getattr(server_args, n) == "flashinfer" for n in names)


def warm_flashinfer_kv_indices(model_runner) -> None:
    if not _uses_flashinfer(getattr(model_runner, "server_args", None)):
        return
    try:
        from sglang.sm120 import upstream_api

        create_flashinfer_kv_indices_triton = upstream_api.require("create_flashinfer_kv_indices_triton")

        req_to_token = model_runner.req_to_token_pool.req_to_token
        device = req_to_token.device
        indptr = torch.zeros(2, dtype=torch.int32, device=device)
        indices = torch.zeros(8, dtype=torch.int32, device=device)
        for req_dtype in (torch.int64, torch.int32):
            for len_dtype in (torch.int64, torch.int32):
                for start in (None, torch.zeros(1, dtype=torch.int64, device=device)):
                    # length 0: reads no pool row, writes no index
                    create_flashinfer_kv_indices_triton[(1,)](
                        req_to_token, torch.zeros(1, dtype=req_dtype, device=device),
                        torch.zeros(1, dtype=len_dtype, device=device), indptr, start, indices,
                        req_to_token.shape[1],
                    )
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build FlashInfer's KV-index kernel: %s", e)


def power_of_two_bounds(max_running_requests: int) -> list:
    """1 .. next_power_of_2(max_running_requests): the batch bounds the paged allocator's kernels and
    the DSA key gather specialise on."""
    bounds, b = [], 1
    while True:
        bounds.append(b)
        if b >= max(1, int(max_running_requests)):
            return bounds
        b *= 2


def warm_paged_allocator(model_runner) -> None:
    allocator = getattr(model_runner, "token_to_kv_pool_allocator", None)
    page_size = int(getattr(allocator, "page_size", 1) or 1)
    if page_size <= 1:
        return
    try:
        from sglang.sm120 import upstream_api

        alloc_extend_kernel = upstream_api.require("alloc_extend_kernel")
        alloc_decode_kernel = upstream_api.require("alloc_decode_kernel")

        device = model_runner.req_to_token_pool.req_to_token.device
        row_dtype = model_runner.req_to_token_pool.req_to_token.dtype
        tic, n = time.perf_counter(), 0
        for bs_upper in power_of_two_bounds(model_runner.max_running_requests):
            # one request of one fresh page, on scratch tensors: the allocator's own free list is
            # not touched (its pointer is not specialised on, so a scratch one compiles the same)
            free_pages = torch.arange(1, 3, dtype=torch.int64, device=device)
            lens = torch.full((1,), page_size, dtype=torch.int64, device=device)
            prefix = torch.zeros(1, dtype=torch.int64, device=device)
            for last_dtype in sorted({torch.int64, row_dtype}, key=str):
                last = torch.full((1,), -1, dtype=last_dtype, device=device)
                out = torch.empty(page_size, dtype=torch.int64, device=device)
                alloc_extend_kernel[(1,)](prefix, lens, last, free_pages, out, bs_upper, page_size)
                n += 1
            last = torch.full((1,), page_size - 1, dtype=row_dtype, device=device)
            alloc_decode_kernel[(1,)](lens + 1, last, free_pages, torch.empty(1, dtype=torch.int64, device=device),
                                      bs_upper, page_size)
            n += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("layerwise: built %d paged-KV allocator kernels (page size %d) in %.1f s",
                    n, page_size, time.perf_counter() - tic)
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build the paged KV allocator kernels: %s", e)


def warm_dsa_index_gather(model_runner) -> None:
    """The DSA indexer's prefill gather of its FP8 keys (upstream `_get_k_and_s_triton`, 0.5.16) is
    a Triton kernel specialised on the power of two of the batch's request count and on the page
    table's width (1, a multiple of 16, other), so the first eager prefill of each kind would
    compile it after capture. Built here, before the traps arm, for every power of two up to
    max_running_requests, on scratch page tables that point at page 0 of layer 0's buffer (only
    read)."""
    pool = getattr(model_runner, "token_to_kv_pool", None)
    bufs = getattr(pool, "index_k_with_scale_buffer", None)
    if not bufs:
        return
    from sglang.sm120 import upstream_api

    if not upstream_api.has("dsa_get_k_and_s_triton"):
        logger.info("layerwise: DSA key gather not pre-built: %s", upstream_api.ABSENT["dsa_get_k_and_s_triton"])
        return
    try:
        gather = upstream_api.require("dsa_get_k_and_s_triton")
        buf = bufs[0]
        device = buf.device
        tic, n = time.perf_counter(), 0
        for seqs in power_of_two_bounds(model_runner.max_running_requests):
            for width in (1, 16, 3):  # Triton specialises an int argument on == 1 and on % 16
                table = torch.zeros((seqs, width), dtype=torch.int32, device=device)
                lens = torch.ones(seqs, dtype=torch.int64, device=device)
                gather(buf=buf, page_indices=table, seq_lens=lens, seq_len_sum=seqs, max_seq_len=1,
                       page_size=pool.page_size, index_head_dim=pool.index_head_dim)
                n += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        logger.info("layerwise: built %d DSA key-gather kernels in %.1f s", n, time.perf_counter() - tic)
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-build the DSA key-gather kernel: %s", e)


def warm_flashinfer_mla_prefill(model_runner) -> None:
    """Plan the FlashInfer MLA backend's ragged prefill once (one request of one token), the way
    its indices updater does on an extend, so the module loads before the traps arm."""
    from sglang.sm120 import upstream_api

    backend = getattr(model_runner, "attn_backend", None)
    try:
        if not isinstance(backend, upstream_api.require("FlashInferMLAAttnBackend")):
            return
        upd = backend.indices_updater_prefill
        indptr = torch.tensor([0, 1], dtype=torch.int32, device=model_runner.device)
        tic = time.perf_counter()
        backend.prefill_wrapper_ragged.begin_forward(
            qo_indptr=indptr, kv_indptr=indptr, num_qo_heads=upd.num_local_heads,
            num_kv_heads=upd.num_local_heads, head_dim_qk=upd.qk_nope_head_dim + upd.qk_rope_head_dim,
            head_dim_vo=upd.v_head_dim, q_data_type=upd.q_data_type, causal=True,
        )
        logger.info("layerwise: FlashInfer MLA ragged prefill planned in %.1f s", time.perf_counter() - tic)
    except Exception as e:  # noqa: BLE001
        logger.warning("layerwise: could not pre-load FlashInfer's MLA ragged prefill module: %s", e)
