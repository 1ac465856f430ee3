"""The grouped NVFP4 W4A16 MoE (kernels.moe_w4a16) on the GPU against kernels.moe.moe_reference
(pure torch from the ModelOpt tensors), on the MoE shapes of sglang.sm120.model_shapes.MOE_SHAPES
(GLM-5 one rank of TP 8 and of EP 8, Qwen3-30B-A3B), top-8, tokens 1 to 1024.

    SGLANG_SM120_KERNEL_LIB=$PWD/python/sglang/sm120/kernels/lib python3 -m pytest -q -m gpu test/gpu/test_moe_w4a16.py

Tolerance: sglang.sm120.moe_tolerance (the kernel and the reference round to bf16 at the same
points; the bound covers their fp32 sums in another order and one bf16 ulp where a rounding then
goes the other way). Expert-parallel ids (glm5-ep8: ids over 256 global experts, this rank's 32
are [0, 32)) outside [0, E) must contribute nothing, bit for bit. A few minutes on an H200: one
shape set's experts are built once (the EP-8 set is ~0.7 GB packed; all three ~3.5 GB with
their ModelOpt tensors).
"""
import pytest
import torch

from sglang.sm120.model_shapes import MOE_SHAPES, moe_shape

pytestmark = pytest.mark.gpu

TOKENS = (1, 2, 3, 8, 17, 64, 255, 256, 1024)
SHAPE_NAMES = [s.name for s in MOE_SHAPES]
SEED = 1234


@pytest.fixture(scope="module")
def experts(K):
    """name -> (MoeShape, ModelOpt tensors, PackedExperts), built at first use and kept for the
    module (the three sets together hold ~3.5 GB: tensors and packed copies)."""
    from sglang.sm120.kernels import moe

    cache = {}

    def get(name):
        if name not in cache:
            s = moe_shape(name)
            tensors = moe.synthetic_experts(s.experts, s.hidden, s.inter, "cuda", seed=SEED)
            cache[name] = (s, tensors, K.pack_experts(**tensors))
        return cache[name]

    yield get
    cache.clear()
    torch.cuda.empty_cache()


def _hidden(t, h, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(t, h, device="cuda", generator=g).to(torch.bfloat16)


def _check(K, s, tensors, packed, x, ids, w, what):
    from sglang.sm120.moe_tolerance import check_moe

    y = K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=s.routed_scaling)
    c = check_moe(y, x, ids, w, tensors, routed_scaling_factor=s.routed_scaling)
    assert c.ok, f"{s.name} {what}: {c.summary()}"
    return y


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_matches_reference(K, experts, name, tokens):
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts(name)
    ids, w = synthetic_routing(tokens, s.topk, s.routed_over, "cuda", seed=tokens)
    x = _hidden(tokens, s.hidden, tokens)
    y = _check(K, s, tensors, packed, x, ids, w, f"T={tokens}")
    if s.routed_over > s.experts:  # tokens with no local expert: exactly zero
        none_local = ~(ids < s.experts).any(dim=1)
        assert bool((y[none_local] == 0).all()), f"{name} T={tokens}: a token without a local expert is not 0"


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_experts_with_zero_rows(K, experts, name):
    """Every token on the same few experts (active = topk), the others with no rows."""
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts(name)
    for tokens in (3, 255):
        ids, w = synthetic_routing(tokens, s.topk, s.experts, "cuda", seed=7 + tokens, active=s.topk)
        # the active experts at the top of the range, so the zero-row ones lie below and above them
        ids = ids + (s.experts - s.topk) // 2
        _check(K, s, tensors, packed, _hidden(tokens, s.hidden, 5), ids, w, f"T={tokens} on {s.topk} experts")


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_all_tokens_on_one_expert(K, experts, name):
    """Slot 0 of every token on the last expert, the other slots on no local expert: 1024 rows of
    one expert (many M tiles), every other expert empty."""
    s, tensors, packed = experts(name)
    t = 1024
    ids = torch.full((t, s.topk), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = s.experts - 1
    w = torch.rand(t, s.topk, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    _check(K, s, tensors, packed, _hidden(t, s.hidden, 9), ids, w, "all tokens on one expert")


def test_ep_ids_outside_the_rank_contribute_nothing(K, experts):
    """glm5-ep8: ids over 256 global experts. Non-local ids as themselves (>= 32), as -1, as large
    int64 values, or with their routing weights changed: the same bits."""
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts("glm5-ep8")
    assert s.routed_over > s.experts
    t = 256
    ids, w = synthetic_routing(t, s.topk, s.routed_over, "cuda", seed=11)
    local = ids < s.experts
    assert bool(local.any()) and not bool(local.all())
    x = _hidden(t, s.hidden, 12)
    run = lambda i, wt: K.moe_w4a16(x, i, wt, packed, routed_scaling_factor=s.routed_scaling)  # noqa: E731
    y = _check(K, s, tensors, packed, x, ids, w, "global ids")
    variants = {
        "-1": (torch.where(local, ids, -1), w),
        "int64, shifted up": (torch.where(local, ids.long(), ids.long() + 1000), w),
        "other weights": (ids, torch.where(local, w, w * 7 + 1)),
    }
    for what, (i, wt) in variants.items():
        assert torch.equal(run(i.contiguous(), wt.contiguous()), y), f"non-local ids as {what} changed the output"
    # and the local slots alone, each token's non-local slots dropped: the same bits again
    assert torch.equal(run(torch.where(local, ids, -1), torch.where(local, w, 0.0)), y)


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_deterministic_and_graph_replay_is_bitwise_eager(K, experts, name):
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts(name)
    t = 64
    ids, w = synthetic_routing(t, s.topk, s.routed_over, "cuda", seed=21)
    x = _hidden(t, s.hidden, 22)
    run = lambda: K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=s.routed_scaling)  # noqa: E731
    eager = run()
    assert torch.equal(run(), eager), f"{name}: two calls on the same inputs differ"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = run()
    for _ in range(2):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager), f"{name}: CUDA-graph replay differs from eager"
    # a replay on new routing and inputs written into the captured buffers: the new eager result
    ids2, w2 = synthetic_routing(t, s.topk, s.routed_over, "cuda", seed=23)
    ids.copy_(ids2)
    w.copy_(w2)
    x.copy_(_hidden(t, s.hidden, 24))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run()), f"{name}: replay on new inputs differs from eager"


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_pdl_plain_and_forced_m_tiles_give_the_same_bits(K, experts, name):
    """Programmatic dependent launch changes when the kernels start, not what they read: eager
    and in a CUDA graph, at the plan's M tiles 1, 2 and 4, both launches give identical outputs;
    so does any forced M tile (the sweep's)."""
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts(name)
    for t in (1, 64, 1024):
        ids, w = synthetic_routing(t, s.topk, s.routed_over, "cuda", seed=31 + t)
        x = _hidden(t, s.hidden, 32 + t)
        run = lambda pdl: K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=s.routed_scaling, pdl=pdl)  # noqa: E731
        plain = run(False)
        assert torch.equal(run(True), plain), f"{name} T={t}: PDL launch differs from the plain one"
        # the M tile groups rows and each row's sums keep their order, given the same warps per tile
        # (the plan would pick those from the rows per tile, which a forced M tile can change)
        plan = K.moe_plan(t, s.topk, s.experts, s.hidden, s.inter)
        for m in (1, 2, 4):
            y = K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=s.routed_scaling, m_tiles=m,
                            gate_up_k_warps=plan["gate_up_k_warps"], down_k_warps=plan["down_k_warps"])
            assert torch.equal(y, plain), f"{name} T={t}: M tiles {m} differ from the plan's"
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(True)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            captured = run(True)
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, plain), f"{name} T={t}: PDL launch in a CUDA graph differs from the plain one"


def test_argument_errors(K, experts):
    from sglang.sm120.kernels.moe import synthetic_routing

    s, tensors, packed = experts("qwen3-30b")
    t = 4
    ids, w = synthetic_routing(t, s.topk, s.experts, "cuda", seed=1)
    x = _hidden(t, s.hidden, 1)
    cases = [
        (TypeError, "hidden_states", dict(hidden_states=x.float())),
        (ValueError, "does not match the experts' hidden size", dict(hidden_states=x[:, :-16].contiguous())),
        (ValueError, "no tokens", dict(hidden_states=x[:0], topk_ids=ids[:0], topk_weights=w[:0])),
        (TypeError, "topk_ids", dict(topk_ids=ids.to(torch.int16))),
        (TypeError, "topk_weights", dict(topk_weights=w.to(torch.bfloat16))),
        (ValueError, "must both be", dict(topk_ids=ids[:-1].contiguous(), topk_weights=w[:-1].contiguous())),
        (ValueError, "must both be", dict(topk_weights=w[:, :-1].contiguous())),
        (ValueError, "CUDA tensor", dict(topk_ids=ids.cpu())),
        (ValueError, "contiguous", dict(topk_ids=ids.t().contiguous().t())),
        (ValueError, "out must have shape", dict(out=torch.empty(t + 1, s.hidden, dtype=torch.bfloat16, device="cuda"))),
    ]
    base = dict(hidden_states=x, topk_ids=ids, topk_weights=w)
    for exc, words, override in cases:
        args = {**base, **override}
        with pytest.raises(exc, match=words):
            K.moe_w4a16(args.pop("hidden_states"), args.pop("topk_ids"), args.pop("topk_weights"), packed, **args)
    with pytest.raises(ValueError, match="w2_weight must have shape"):
        K.pack_experts(**{**tensors, "w2_weight": tensors["w2_weight"][:, :-16]})
