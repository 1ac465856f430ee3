"""Calls of every helper the series routes through compile_unless_dynamo_free, on the installed
patched tree, for the Dynamo-free tests (test/cpu/runner/test_dynamo_free_bits_*.py and
test_dynamo_free_routes.py).

A Case runs one routed helper on fresh inputs (built from a seed, so the Dynamo-free and the
compiled run see the same values) and returns what the helper produced: its outputs and the
tensors it writes into. `outputs(case, dynamo_free)` runs it in either mode; in Dynamo-free mode
it also counts the Dynamo frames the call evaluated (none allowed). Inputs have the shapes the
shipped models give these helpers (GLM-5 / DeepSeek MLA, Qwen3-MoE, vocabularies of 32k-152k)
scaled down where the helper works row by row, and values where a bf16 round trip between ops
shows (products and quotients of bf16 values, scales near powers of two).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import torch

ENV = "SGLANG_SM120_DYNAMO_FREE"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@dataclass
class Case:
    site: str  # its key in test/cpu/runner/torch_compile_sites.toml
    label: str  # what the inputs are, for messages
    call: Callable[[], Any]
    bits: bool = True  # False: the compiled form is not reproduced eagerly (NOT_REPRODUCED)


# Routed sites whose compiled form no eager op reproduces, with why; their Dynamo-free form is
# still checked to run without Dynamo (test_dynamo_free_routes.py).
NOT_REPRODUCED = {
    "sglang/srt/layers/moe/topk.py::grouped_topk_gpu":
        "softmax / sigmoid and the renormalising division: Triton's approximate exp and division",
    "sglang/srt/layers/moe/topk.py::biased_grouped_topk_impl":
        "sigmoid and the renormalising division: Triton's approximate exp and division",
    "sglang/srt/layers/moe/topk.py::biased_topk_impl":
        "sigmoid and the renormalising division: Triton's approximate exp and division",
    "sglang/srt/layers/moe/topk.py::kimi_k2_biased_topk_impl":
        "sigmoid and the renormalising division: Triton's approximate exp and division",
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def mode(dynamo_free: bool):
    old = os.environ.get(ENV)
    os.environ[ENV] = "1" if dynamo_free else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values()) + sum(counters["stats"].values())


def outputs(case: Case, dynamo_free: bool):
    """(what the helper produced, Dynamo frames/stats counted during the call)."""
    before = dynamo_frames()
    with mode(dynamo_free):
        out = case.call()
    return out, dynamo_frames() - before


def bitwise_equal(a, b) -> bool:
    """Same structure, dtypes, shapes and bits (NaN payloads and signed zeros included)."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(bitwise_equal, a, b))
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():
            ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))
        return torch.equal(a, b)
    return a == b


def differing(a, b) -> str:
    if isinstance(a, (tuple, list)):
        return "; ".join(differing(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape:
        return f"{int((a != b).sum())} of {a.numel()} differ"
    return f"{a!r} vs {b!r}"


# ---------------------------------------------------------------------------- sampling (0109)
def _hash_stand_in(seed, positions, col_indices):
    """The sampler's murmur_hash32 is a Triton kernel (no CPU); on the GPU it is an opaque integer
    kernel inside the compiled graph, so both forms get the same hashes. This integer mix gives
    uint32-range values through torch ops."""
    h = (seed.to(torch.int64)[:, None] * 0x9E3779B1 + positions.to(torch.int64)[:, None] * 0x85EBCA6B
         + col_indices.to(torch.int64)[None, :] * 0xC2B2AE35)
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    return (h ^ (h >> 13)) & 0xFFFFFFFF


@contextlib.contextmanager
def stand_ins():
    """What CPU lacks: the sampler's Triton hash; 0.5.16's Triton fill of padded top-k rows
    (its torch fallback instead; on CUDA both forms call the same integer kernel)."""
    from sglang.srt.layers import sampler
    from sglang.srt.layers.moe import topk

    saved = [(sampler, "murmur_hash32", _hash_stand_in)]
    if hasattr(topk, "_can_fuse_padded_region"):
        saved.append((topk, "_can_fuse_padded_region", lambda topk_ids: False))
    saved = [(m, name, getattr(m, name), new) for m, name, new in saved]
    for m, name, _, new in saved:
        setattr(m, name, new)
    try:
        yield
    finally:
        for m, name, old, _ in saved:
            setattr(m, name, old)


def sampling_cases() -> List[Case]:
    from sglang.srt.layers import sampler
    from sglang.srt.sampling.penaltylib import repetition_penalty

    out = []
    for seed, (rows, vocab) in enumerate(((5, 32000), (3, 151936), (8, 4096))):
        def seeded(seed=seed, rows=rows, vocab=vocab):
            g = _gen(seed)
            logits = torch.randn(rows, vocab, generator=g) * 3
            probs = torch.softmax(logits, dim=-1)
            probs[:, vocab // 2:] = 0.0  # top-k / top-p filtered: log gives -inf
            logprobs = probs.to(torch.float64).log_()
            seeds = torch.randint(0, 2**31, (rows,), generator=g)
            positions = torch.randint(0, 8192, (rows,), generator=g)
            return sampler.multinomial_with_seed(logprobs, seeds, positions)
        out.append(Case("sglang/srt/layers/sampler.py::multinomial_with_seed",
                        f"fp64 logprobs {rows}x{vocab}", seeded))
    for seed, dtype in enumerate((FP32, BF16, FP16)):
        def penalty(seed=seed, dtype=dtype):
            g = _gen(seed)
            logits = (torch.randn(6, 32000, generator=g) * 4).to(dtype)
            penalties = torch.ones(6, 32000)
            seen = torch.randint(0, 32000, (6, 300), generator=g)
            penalties.scatter_(1, seen, torch.tensor([1.1, 1.3, 0.9, 1.05, 2.0, 1.2])[:, None].expand(6, 300))
            repetition_penalty.apply_scaling_penalties(logits, penalties)
            return logits
        out.append(Case("sglang/srt/sampling/penaltylib/repetition_penalty.py::apply_scaling_penalties",
                        f"{dtype} logits", penalty))
    return out


# -------------------------------------------------------------------- overlap assert (0111)
def overlap_cases() -> List[Case]:
    from sglang.srt.managers import overlap_utils

    def invalidate(seed=0):
        g = _gen(seed)
        values = torch.randint(0, 4096, (37,), generator=g)
        buf = torch.randint(0, 4096, (512,), generator=g)
        indices = torch.randperm(512, generator=g)[:37]
        overlap_utils._assert_nonneg_and_invalidate(values, buf, indices)
        return buf
    return [Case("sglang/srt/managers/overlap_utils.py::_assert_nonneg_and_invalidate",
                 "int64 seq lens, 37 of 512 slots", invalidate)]


# ----------------------------------------------------------- vocab-parallel embedding (0107)
def vocab_cases() -> List[Case]:
    from sglang.srt.layers import vocab_parallel_embedding as vpe

    out = []
    # (org start, org end, padding, added start, added end): TP shards of a 151936-token vocab
    for seed, shard in enumerate(((0, 75968, 0, 151936, 151936), (75968, 151936, 64, 152000, 152064))):
        def masked(seed=seed, shard=shard):
            ids = torch.randint(0, 152064, (257,), generator=_gen(seed))
            return vpe.get_masked_input_and_mask(ids, *shard)
        out.append(Case("sglang/srt/layers/vocab_parallel_embedding.py::get_masked_input_and_mask",
                        f"shard {shard}", masked))
    return out


# ------------------------------------------------------------------ MoE helpers (0106)
def moe_cases() -> List[Case]:
    from sglang.srt.layers.moe import topk as topk_mod
    from sglang.srt.layers.moe import waterfill
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    out = []
    for seed, dtype in enumerate((BF16, FP16)):
        # top-k 4 (< Inductor's unroll threshold of 8): the sum is one fp32 chain on CPU and GPU
        # alike. At top-k >= 8 the CPU kernel stores the bf16 sum before the scale where the GPU's
        # fuses it, so the CPU kernel is no oracle there (the GPU identity tests are).
        for scale in (2.5, 1.0):
            def sum_reduce(seed=seed, dtype=dtype, scale=scale):
                x = torch.randn(29, 4, 2048, generator=_gen(seed)).to(dtype)
                out_ = torch.empty(29, 2048, dtype=dtype)
                fused_moe.moe_sum_reduce_torch_compile(x, out_, scale)
                return out_
            out.append(Case("sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py::moe_sum_reduce_torch_compile",
                            f"{dtype} 29x4x2048 scale {scale}", sum_reduce))
    for name, extra in (("_swiglu_silu_clamp_mul", (7.0,)),
                        ("swiglu_gpt_oss_sigmoid_alpha", (1.702, 7.0)),
                        ("swiglu_no_interleaved_with_alpha_and_limit", (1.702, 7.0))):
        def swiglu(name=name, extra=extra):
            x = (torch.randn(37, 2 * 1440, generator=_gen(3)) * 4).to(BF16)
            return getattr(fused_moe, name)(x, *extra)
        out.append(Case(f"sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py::{name}",
                        "bf16 37x2880", swiglu))

    def postprocess(seed=4):
        ids = torch.randint(0, 256, (41, 8), generator=_gen(seed)).to(torch.int32)
        return topk_mod._biased_grouped_topk_postprocess(ids, None, torch.tensor(29))
    out.append(Case("sglang/srt/layers/moe/topk.py::_biased_grouped_topk_postprocess",
                    "int32 ids 41x8, 29 real rows", postprocess))

    for seed, wdtype in enumerate((FP32, BF16)):
        def expand(seed=seed, wdtype=wdtype):
            g = _gen(seed)
            ids = torch.randint(0, 256, (33, 8), generator=g).to(torch.int32)
            ids[5] = -1  # a padded token
            ids[7, 3:] = -1
            weights = torch.rand(33, 8, generator=g).to(wdtype)
            return waterfill.expand_topk_with_shared_expert(ids, weights, 256, 8, 3, 2.5)
        out.append(Case("sglang/srt/layers/moe/waterfill.py::expand_topk_with_shared_expert",
                        f"{wdtype} weights, EP 8", expand))

    # the fallbacks whose compiled form is not reproduced: Dynamo-free run only
    def router(fn, *args):
        def call():
            g = _gen(5)
            hidden = torch.randn(19, 64, generator=g).to(BF16)
            logits = torch.randn(19, 160, generator=g)
            bias = torch.randn(160, generator=g) * 0.1
            return fn(hidden, logits, *(bias if a == "bias" else a for a in args))
        return call
    for name, args in (("grouped_topk_gpu", (8, True, 8, 4, 0, 2.5)),
                       ("biased_grouped_topk_impl", ("bias", 8, True, 8, 4, 0, 2.5)),
                       ("biased_topk_impl", ("bias", 8, True)),
                       ("kimi_k2_biased_topk_impl", ("bias", 8, True, 2.5, True))):
        site = f"sglang/srt/layers/moe/topk.py::{name}"
        out.append(Case(site, "fp32 router logits 19x160", router(getattr(topk_mod, name), *args), bits=False))
    return out


# ---------------------------------------------------------------- FP4 KV cache (0110)
def _block_maxima_near_powers_of_two(dtype, g) -> torch.Tensor:
    """[B, M, N] KV whose 16-value blocks have maxima 6 * 2^k and the next values above: where
    ceil(log2(max / 6)) in bf16 lands on the exponent below the fp32 one."""
    tokens, heads, dim = 8, 4, 128
    x = (torch.rand(tokens, heads * dim // 16, 16, generator=g) * 2 - 1)
    k = torch.randint(-6, 5, (tokens, heads * dim // 16), generator=g).to(torch.float32)
    top = (6.0 * torch.exp2(k)).to(dtype)
    up = torch.randint(0, 3, top.shape, generator=g)  # 0, 1 or 2 steps above 6 * 2^k
    bits = top.view(torch.int16) + up.to(torch.int16)
    top = bits.view(dtype).float()
    x = x * top[..., None] * 0.99
    x[..., 0] = top * torch.where(torch.rand(top.shape, generator=g) < 0.5, 1.0, -1.0)
    return x.view(tokens, heads, dim).to(dtype)


def kv_cases() -> List[Case]:
    from sglang.srt.layers.quantization.kvfp4_tensor import FP4MXBlock16KVQuantizeUtil as fp4

    out = []
    for dtype in (BF16, FP16):
        for seed, kind in enumerate(("mha 37x8x128", "mla 37x1x512", "near 6*2^k")):
            def quantize(seed=seed, kind=kind, dtype=dtype):
                g = _gen(seed)
                if kind.startswith("near"):
                    x = _block_maxima_near_powers_of_two(dtype, g)
                else:
                    shape = (37, 8, 128) if kind.startswith("mha") else (37, 1, 512)
                    x = (torch.randn(*shape, generator=g) * torch.rand(*shape[:2], 1, generator=g) * 8).to(dtype)
                return fp4.batched_quantize(x)
            out.append(Case("sglang/srt/layers/quantization/kvfp4_tensor.py::FP4MXBlock16KVQuantizeUtil.batched_quantize",
                            f"{dtype} {kind}", quantize))

        def dequantize(dtype=dtype):
            g = _gen(7)
            packed = torch.randint(0, 256, (37, 8, 64), generator=g).to(torch.uint8)
            scales = torch.randint(100, 140, (37, 8 * 128 // 16), generator=g).to(torch.uint8)
            return fp4.batched_dequantize(packed, scales, dtype)
        out.append(Case("sglang/srt/layers/quantization/kvfp4_tensor.py::FP4MXBlock16KVQuantizeUtil.batched_dequantize",
                        f"to {dtype}", dequantize))
    return out


# ----------------------------------------------------------------- native rope (0112)
@contextlib.contextmanager
def native_rope_construction():
    """RotaryEmbedding routes apply_rotary_emb through the switch when it runs natively: with
    --rl-on-policy-target (which also moves its inverse frequencies to CUDA) or on MUSA. On CPU
    the MUSA branch, with the flag read as unset."""
    from sglang.srt.layers.rotary_embedding import base

    saved = {k: getattr(base, k) for k in ("_is_musa", "get_server_args", "publish_role") if hasattr(base, k)}
    base._is_musa = True
    if "get_server_args" in saved:  # 0.5.16 reads the flag off the server args
        base.get_server_args = lambda: SimpleNamespace(rl_on_policy_target=None)
    if "publish_role" in saved:  # 0.5.23: no published role, so no rl_on_policy_target either
        base.publish_role = lambda: None
    try:
        yield base
    finally:
        for k, v in saved.items():
            setattr(base, k, v)


_ROPES: Dict[bool, Any] = {}


def native_rope(neox: bool):
    if neox not in _ROPES:
        with native_rope_construction() as base:
            _ROPES[neox] = base.RotaryEmbedding(64, 64, 32768, 10000, neox, BF16)
    return _ROPES[neox]


def rope_cases() -> List[Case]:
    out = []
    for dtype, neox, cache in ((BF16, True, FP32), (BF16, False, FP32), (FP16, True, FP32), (BF16, True, BF16)):
        def rope(dtype=dtype, neox=neox, cache=cache):
            emb = native_rope(neox)
            g = _gen(int(neox) + 2 * (dtype == FP16) + 4 * (cache == BF16))
            positions = torch.randint(0, 32768, (37,), generator=g)
            cos, sin = emb.cos_sin_cache.index_select(0, positions).to(cache).chunk(2, dim=-1)
            x = (torch.randn(37, 16, 64, generator=g) * 2).to(dtype)
            return emb._apply_rotary_emb_wrapped(x, cos, sin, neox)
        out.append(Case("sglang/srt/layers/rotary_embedding/base.py::RotaryEmbedding.__init__",
                        f"{dtype} q, {'neox' if neox else 'gpt-j'}, {cache} cos/sin", rope))
    return out


# ------------------------------------------------------------------ DSA indexer (0108)
class IndexerState:
    """What the indexer's helpers read off `self` (GLM-5 indexer: 32 heads of 128)."""

    n_heads, head_dim = 32, 128
    softmax_scale = 128 ** -0.5

    def __init__(self, hidden: int = 512):
        self.w = torch.randn(self.n_heads, hidden, generator=_gen(11)) / hidden ** 0.5
        self.weights_proj = lambda x: (x.float() @ self.w.t(), None)

    def _weights_proj_bf16_in_fp32_out(self, x):
        return x.float() @ self.w.t()


def dsa_cases(base: str) -> List[Case]:
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.layers.attention.dsa import dsa_indexer

    classes = {"Indexer": dsa_indexer.Indexer}
    if base != "0.5.16":
        from sglang.srt.layers.attention.dsa import dsa_indexer_kpool

        classes["IndexerKPool"] = dsa_indexer_kpool.IndexerKPool
    files = {"Indexer": "sglang/srt/layers/attention/dsa/dsa_indexer.py",
             "IndexerKPool": "sglang/srt/layers/attention/dsa/dsa_indexer_kpool.py"}
    me = IndexerState()
    out = []

    def inputs(seed):
        g = _gen(seed)
        return (torch.randn(37, 512, generator=g).to(BF16), torch.rand(37, 32, 1, generator=g) + 0.5,
                torch.randn(37, 32, generator=g))
    for cls_name, cls in classes.items():
        for name in ("_project_and_scale_head_gates", "_get_logits_head_gate",
                     "_apply_q_scale_and_softmax_scale", "_scale_head_gates"):
            if not hasattr(cls, name):
                continue
            def call(cls=cls, name=name):
                x, q_scale, raw = inputs(12)
                args = {"_project_and_scale_head_gates": (x,), "_get_logits_head_gate": (x, q_scale),
                        "_apply_q_scale_and_softmax_scale": (raw, q_scale),
                        "_scale_head_gates": (raw, q_scale)}[name]
                return getattr(cls, name)(me, *args)
            out.append(Case(f"{files[cls_name]}::{cls_name}.{name}", "fp32 gates of 37 tokens x 32 heads", call))

    def cat():
        g = _gen(13)
        return dsa_backend._compiled_cat([torch.randn(37, 1, 512, generator=g).to(BF16),
                                          torch.randn(37, 1, 64, generator=g).to(BF16)], dim=-1)
    out.append(Case("sglang/srt/layers/attention/dsa_backend.py::_compiled_cat", "bf16 k_nope | k_rope", cat))
    return out


def all_cases(base: str) -> List[Case]:
    return (sampling_cases() + overlap_cases() + vocab_cases() + moe_cases() + kv_cases()
            + rope_cases() + dsa_cases(base))


def cpu_inductor_settings():
    """One compile thread (no worker pool on a 2-core box) for the module's compiles."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(compile_threads=1)


def key(case: Case) -> str:
    return f"{case.site.split('::')[1]} [{case.label}]"


def compare(cases: List[Case]) -> Dict[str, dict]:
    """For each case: the Dynamo-free form (twin or plain body) against the compiled helper,
    bitwise; for a helper with a twin, its plain body against the compiled helper too."""
    from sglang.sm120.runner import dynamo_free

    results: Dict[str, dict] = {}
    for case in cases:
        eager, frames = outputs(case, True)
        compiled, _ = outputs(case, False)
        r = {"equal": bitwise_equal(eager, compiled), "dynamo_frames_eager": frames,
             "diff": differing(eager, compiled), "plain_equal": None}
        twins = dynamo_free.TWINS
        dynamo_free.TWINS = {}  # what lab variant plain-eager-helpers does
        try:
            plain, _ = outputs(case, True)
        finally:
            dynamo_free.TWINS = twins
        if not bitwise_equal(plain, eager):
            r["plain_equal"] = bitwise_equal(plain, compiled)
        results[key(case)] = r
    return results


def bit_tests(cases: List[Case]):
    """(results fixture, test) of a test module over `cases`: each case's Dynamo-free form gives
    the compiled helper's bits and enters no Dynamo frame. Bind both at module level, as
    `results, test_dynamo_free_form_gives_the_compiled_bits = bit_tests(CASES)`."""
    import pytest

    @pytest.fixture(scope="module")
    def results(one_thread):
        with cpu_inductor_settings(), stand_ins():
            return compare(cases)

    @pytest.mark.parametrize("key", [key(c) for c in cases])
    def test_dynamo_free_form_gives_the_compiled_bits(results, key):
        r = results[key]
        assert r["dynamo_frames_eager"] == 0, r
        assert r["equal"], r["diff"]

    return results, test_dynamo_free_form_gives_the_compiled_bits


def installed_base() -> Optional[str]:
    from sglang.sm120 import upstream_api

    return upstream_api.check_installed()
