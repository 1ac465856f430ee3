"""NVFP4 kernels on the GPU against the pure-PyTorch reference (sglang.sm120.nvfp4).

Run with the fork installed, on the library it carries, or on one built from this checkout:
    python3 -m forkbuild.kernels --out python/sglang/sm120/kernels/lib
    SGLANG_SM120_KERNEL_LIB=$PWD/python/sglang/sm120/kernels/lib python3 -m pytest -q -m gpu test/gpu/test_kernels.py

Tolerance of the GEMMs (elementwise, documented in docs/kernels.md):
    |y - ref| <= 2^-8 * |ref| + 2^-14 * (|x| @ |W|^T)
ref is the fp32 product of exactly the quantized operands; the first term covers the bf16 output
rounding (half an ulp is 2^-9), the second fp32 accumulation in a different order (split-K,
tensor-core accumulation). Dropping or mis-scaling one 16-element block changes a result by about
16/K of |x| @ |W|^T, far above 2^-14 for every K tested (<= 16384).
"""

import pytest
import torch

from sglang.sm120 import nvfp4 as F
from sglang.sm120.model_shapes import projection_shapes

pytestmark = pytest.mark.gpu

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]


def _shapes():
    """Distinct (N, K) of the attention and shared-expert projections at TP 1, 4, 8 (sglang.sm120.model_shapes)."""
    seen, uniq = set(), []
    for name, n, k in projection_shapes():
        if (n, k) not in seen:
            seen.add((n, k))
            uniq.append((name, n, k))
    return uniq


SHAPES = _shapes()


def _assert_close(y, ref, absref, what):
    y = y.float()
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -14 * absref
    err = (y - ref).abs()
    bad = ~(err <= bound)  # NaN counts as bad
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {y.numel()} outside tolerance; first at {idx}: "
                             f"got {y[tuple(idx)].item()}, ref {ref[tuple(idx)].item()}, bound {bound[tuple(idx)].item()}")


# ----------------------------------------------------------------------------- quantize

def _quant_cases():
    """The check command's quantize cases: rounding, ties, special values, the full exponent range."""
    from sglang.sm120.check.correctness import quantize_cases

    return quantize_cases()


@pytest.mark.parametrize("case", list(_quant_cases()))
@pytest.mark.parametrize("mma_order", [False, True])
def test_quantize_bit_exact(K, case, mma_order):
    x = _quant_cases()[case].to(torch.bfloat16)
    finite = x.float()[torch.isfinite(x.float())]
    amax = finite.abs().max().item() if finite.numel() else 0.0
    gs = 448.0 * 6.0 / amax if 0 < amax < float("inf") and 448.0 * 6.0 / amax < 3e38 else 1.0
    gs_t = torch.tensor([gs], dtype=torch.float32)
    ref_packed, ref_scales = F.quantize_nvfp4(x, gs_t)  # CPU reference
    if mma_order:
        ref_packed = K.p_order_packed(ref_packed)
    ref_sw = F.swizzle_scales(ref_scales)
    packed, scales = K.quantize_nvfp4(x.cuda(), gs_t.cuda(), mma_order=mma_order)
    torch.cuda.synchronize()
    assert packed.shape == ref_packed.shape and scales.shape == ref_sw.shape
    mism = (packed.cpu() != ref_packed).nonzero()
    assert mism.numel() == 0, f"{case}: packed differs at {mism[:5].tolist()} ({mism.shape[0]} bytes)"
    smism = (scales.view(torch.uint8).cpu() != ref_sw.view(torch.uint8)).nonzero()
    assert smism.numel() == 0, f"{case}: scales differ at {smism[:5].tolist()}"


def test_quantize_nan_inf_rules(K):
    x = torch.randn(4, 64)
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    gs = torch.tensor([50.0], device="cuda")
    packed, scales = K.quantize_nvfp4(x.to(torch.bfloat16).cuda(), gs)
    sc = F.unswizzle_scales(scales.cpu(), 4, 64).view(torch.uint8)
    assert sc[0, 0].item() == 0x7F and torch.all(F.unpack_e2m1(packed.cpu())[0, :16] == 0)
    assert sc[1, 1].item() == 0x7E and F.unpack_e2m1(packed.cpu())[1, 20].item() == 7


# ----------------------------------------------------------------------------- GEMMs

def _weight(n, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g) * 0.02
    w[: min(n, 16), :16] = 0.0  # zero-scale blocks
    return F.quantize_weight_modelopt(w)


def _exact_dequant(packed, scales, decode_scale):
    vals = F.e2m1_codes_to_float(F.unpack_e2m1(packed))
    sf = scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    return vals * sf * float(decode_scale)  # e2m1 * e4m3 is exact in fp32


@pytest.mark.parametrize("name,n,k", SHAPES, ids=[s[0].replace(" ", "_") for s in SHAPES])
def test_gemm_shapes_all_m(K, name, n, k):
    q = _weight(n, k, seed=n * 7 + k)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(MS[-1], k, device="cuda", generator=g).to(torch.bfloat16)
    xf = x.float()
    ref16 = xf @ wd.t()
    abs16 = xf.abs() @ wd.abs().t()
    in_s = F.input_scale_from_amax(xf.abs().max())
    xq_ref, xs_ref = F.quantize_nvfp4(x, 1.0 / in_s)
    xd = _exact_dequant(xq_ref, xs_ref, in_s)
    ref4 = xd @ wd.t()
    abs4 = xd.abs() @ wd.abs().t()
    in_s_dev = in_s.reshape(1).cuda()
    inv_dev = (1.0 / in_s).reshape(1).cuda()
    for m in MS:
        for kernel in ("split", "warpk") if m <= K.WARPK_MAX_M else ("split",):
            y = K.gemm_w4a16(x[:m], pw, kernel=kernel)
            _assert_close(y, ref16[:m], abs16[:m], f"{name} W4A16 ({kernel}) M={m}")
        xq, xs = K.quantize_nvfp4(x[:m], inv_dev, mma_order=True)
        y4 = K.gemm_w4a4(xq, xs, in_s_dev, pw)
        _assert_close(y4, ref4[:m], abs4[:m], f"{name} W4A4 ({'hw' if torch.cuda.get_device_capability()[0] == 12 else 'emulated'}) M={m}")


def test_w4a4_emulation_matches_hardware_on_sm120(K):
    if torch.cuda.get_device_capability()[0] != 12:
        pytest.skip("needs an SM120 GPU for the hardware FP4 MMA")
    q = _weight(1024, 2048, 1)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(512, 2048, device="cuda").to(torch.bfloat16)
    in_s = F.input_scale_from_amax(x.float().abs().max()).reshape(1).cuda()
    xq, xs = K.quantize_nvfp4(x, 1.0 / in_s, mma_order=True)
    hw = K.gemm_w4a4(xq, xs, in_s, pw, mode="hardware").float()
    emu = K.gemm_w4a4(xq, xs, in_s, pw, mode="emulate").float()
    assert ((hw - emu).norm() / emu.norm()).item() < 1e-3


def test_bias_odd_m_and_out_buffer(K):
    n, k = 384, 320  # K not a multiple of 64: padded tail
    q = _weight(n, k, 3)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in (3, 77, 131):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = K.gemm_w4a16(x, pw, bias=bias, out=out)
        assert y.data_ptr() == out.data_ptr()
        ref = x.float() @ wd.t() + bias.float()
        _assert_close(y, ref, x.float().abs() @ wd.abs().t() + bias.float().abs(), f"bias M={m}")
        in_s = F.input_scale_from_amax(x.float().abs().max())
        xq, xs = K.quantize_nvfp4(x, (1.0 / in_s).reshape(1).cuda(), mma_order=True)
        xd = _exact_dequant(*F.quantize_nvfp4(x, 1.0 / in_s), in_s)
        y4 = K.gemm_w4a4(xq, xs, in_s.reshape(1).cuda(), pw, bias=bias)
        _assert_close(y4, xd @ wd.t() + bias.float(), xd.abs() @ wd.abs().t() + bias.float().abs(), f"w4a4 bias M={m}")


def test_split_k_is_deterministic_and_graph_capturable(K):
    n, k, m = 1024, 4096, 4
    q = _weight(n, k, 5)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert K.w4a16_plan(m, n, k, sms, kernel="split")["splits"] > 1  # exercises the split-K reduction
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    y1 = K.gemm_w4a16(x, pw, kernel="split").clone()
    y2 = K.gemm_w4a16(x, pw, kernel="split").clone()
    assert torch.equal(y1, y2)
    in_s = torch.tensor([0.01], device="cuda")
    inv = 1.0 / in_s
    xs_static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up: creates this stream's workspace before capture
        K.gemm_w4a16(xs_static, pw, kernel="split")
        K.gemm_w4a4(*K.quantize_nvfp4(xs_static, inv, mma_order=True), in_s, pw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y_g = K.gemm_w4a16(xs_static, pw, kernel="split")
        xq, xsc = K.quantize_nvfp4(xs_static, inv, mma_order=True)
        y4_g = K.gemm_w4a4(xq, xsc, in_s, pw)
    for _ in range(3):
        new = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        xs_static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_g, K.gemm_w4a16(new, pw, kernel="split"))
        assert torch.equal(y4_g, K.gemm_w4a4(*K.quantize_nvfp4(new, inv, mma_order=True), in_s, pw))


PDL_CHAIN_CASES = [(1, "split"), (16, "split"), (64, "split"), (1, "warpk"), (16, "warpk")]


@pytest.mark.parametrize("m,kernel", PDL_CHAIN_CASES, ids=[f"M{m}-{kn}" for m, kn in PDL_CHAIN_CASES])
def test_pdl_chain_in_a_graph_matches_plain_launches(K, m, kernel):
    """Programmatic dependent launch: each GEMM of the chain reads the one before (X written by the
    previous grid) and all share one split-K workspace, the two hazards PDL's early start could
    break. PDL on and off, captured and eager, must agree bit for bit."""
    n = k = 2048  # square: each output is the next input; splits > 1 at every m here
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = K.w4a16_plan(m, n, k, sms, kernel=kernel)
    assert plan["warpk"] if kernel == "warpk" else plan["splits"] > 1
    layers = []
    for i in range(6):
        q = _weight(n, k, 40 + i)
        layers.append(K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"]))

    def chain(x, pdl):
        for pw in layers:
            x = K.gemm_w4a16(x, pw, pdl=pdl, kernel=kernel)
        return x

    x0 = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    eager = {pdl: chain(x0, pdl).clone() for pdl in (False, True)}
    assert torch.isfinite(eager[False].float()).all()
    assert torch.equal(eager[False], eager[True])
    stream = torch.cuda.Stream()
    for pdl in (False, True):
        x_static = x0.clone()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain(x_static, pdl)  # this stream's workspace exists before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = chain(x_static, pdl)
        for rep in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, eager[False]), f"pdl={pdl} replay {rep}"


CLUSTER_CASES = [(5120, 2048, 1), (5120, 2048, 16), (2624, 6144, 8), (16384, 2048, 1), (2048, 4096, 32),
                 (5120, 2048, 64), (3584, 512, 16), (384, 320, 3)]  # (3584, 512): short K, 28 tiles, still splits


@pytest.mark.parametrize("n,k,m", CLUSTER_CASES, ids=[f"N{n}-K{k}-M{m}" for n, k, m in CLUSTER_CASES])
def test_cluster_reduce_gives_the_bits_of_the_workspace_reduction(K, n, k, m):
    """The splits of a tile reduced in a thread-block cluster (DSMEM) sum in the same order as the
    last-CTA reduction through the workspace: identical bits, eager, in a graph and under PDL."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ticket, cluster = K.w4a16_plan(m, n, k, sms, kernel="split"), K.w4a16_plan(m, n, k, sms, cluster=True, kernel="split")
    q = _weight(n, k, n + 7 * m)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    ref = K.gemm_w4a16(x, pw, cluster=False, split_target=0, kernel="split").clone()
    _assert_close(ref, x.float() @ wd.t(), x.float().abs() @ wd.abs().t(), f"tickets N={n} K={k} M={m}")
    if not cluster["cluster"]:
        assert cluster["splits"] == 1 or cluster["splits"] > 8, cluster
        pytest.skip(f"plan does not cluster-reduce: {cluster}")
    assert 2 <= cluster["splits"] <= 8 and cluster["workspace_bytes"] == 0
    if cluster["splits"] == ticket["splits"]:  # same split: same partials, same summation order
        for pdl in (False, True):
            assert torch.equal(K.gemm_w4a16(x, pw, cluster=True, pdl=pdl, kernel="split"), ref), f"pdl={pdl}"
    else:  # the workspace shrank the ticket plan's split: other partials, so check the values
        y = K.gemm_w4a16(x, pw, cluster=True, kernel="split")
        _assert_close(y, x.float() @ wd.t(), x.float().abs() @ wd.abs().t(), f"cluster N={n} K={k} M={m}")
    x_static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        want = K.gemm_w4a16(x_static, pw, cluster=True, pdl=True, kernel="split").clone()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y_g = K.gemm_w4a16(x_static, pw, cluster=True, pdl=True, kernel="split")
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_g, want)


WARPS_CASES = [(5120, 2048, 1), (16384, 2048, 1), (2624, 6144, 8), (2624, 6144, 16), (2048, 4096, 32),
               (5120, 2048, 64), (6144, 256, 128), (384, 320, 3), (28672, 512, 5)]


@pytest.mark.parametrize("n,k,m", WARPS_CASES, ids=[f"N{n}-K{k}-M{m}" for n, k, m in WARPS_CASES])
def test_eight_warps_give_the_bits_of_four(K, n, k, m):
    """8 warps x one 16-row tile per CTA vs 4 warps x two: each accumulator sees the same MMAs in the
    same order, so the bits match, for the ticket and the cluster reduction, with and without PDL,
    at the default and the smallest split, eager and in a graph."""
    q = _weight(n, k, 11 * n + 3 * m)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    for split_target in (0, 1):
        for cluster in (False, True):
            ref = K.gemm_w4a16(x, pw, warps=4, split_target=split_target, cluster=cluster, kernel="split").clone()
            for pdl in (False, True):
                y = K.gemm_w4a16(x, pw, warps=8, split_target=split_target, cluster=cluster, pdl=pdl, kernel="split")
                assert torch.equal(y, ref), f"split_target={split_target} cluster={cluster} pdl={pdl}"
    _assert_close(ref, x.float() @ wd.t(), x.float().abs() @ wd.abs().t(), f"8 warps N={n} K={k} M={m}")
    x_static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        want = K.gemm_w4a16(x_static, pw, warps=4, kernel="split").clone()
        K.gemm_w4a16(x_static, pw, warps=8, kernel="split")  # this stream's workspace exists before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y_g = K.gemm_w4a16(x_static, pw, warps=8, kernel="split")
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_g, want)


def test_pdl_chain_with_cluster_reduce_matches_plain_launches(K):
    n = k = 2048
    layers = []
    for i in range(6):
        q = _weight(n, k, 60 + i)
        layers.append(K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"]))
    x0 = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    outs = {}
    for cluster in (False, True):
        for pdl in (False, True):
            x = x0
            for pw in layers:
                x = K.gemm_w4a16(x, pw, pdl=pdl, cluster=cluster, kernel="split")
            outs[(cluster, pdl)] = x
    torch.cuda.synchronize()
    base = outs[(False, False)]
    assert torch.isfinite(base.float()).all()
    for key, y in outs.items():
        assert torch.equal(y, base), key


def test_split_k_workspace_reused_across_plans(K):
    # The workspace outlives calls; only its ticket region must be zero between them. Partials
    # left by other plans (here: garbage) must not matter, also for plans with > 64 tiles (the
    # H200 failure: their tickets lay in an earlier plan's partial area).
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.zeros((8 << 20) + (256 << 10), dtype=torch.uint8, device="cuda")
    # (N, K, M, split target): 0 = the default plan. The 128- and 96-tile cases name a target of
    # 2 CTAs per SM: the default splits neither (tiles that fill the SMs; 96 tiles at M > 16), and
    # this test is about > 64-tile plans that split.
    cases = ((384, 320, 1, 0), (16384, 2048, 1, 2 * sms), (5120, 2048, 128, 0), (640, 2048, 1024, 0),
             (6144, 256, 128, 2 * sms))
    for n, k, m, target in cases:
        plan = K.w4a16_plan(m, n, k, sms, workspace_bytes=ws.numel(), split_target=target, kernel="split")
        ws[plan["partial_offset"]:].fill_(0xA5)
        q = _weight(n, k, n + m)
        pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
        wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = K.gemm_w4a16(x, pw, workspace_buf=ws, split_target=target, kernel="split")
        _assert_close(y, x.float() @ wd.t(), x.float().abs() @ wd.abs().t(),
                      f"reused workspace M={m} N={n} K={k} splits={plan['splits']} tiles={plan['n_ctas'] * plan['m_blocks']}")
        tickets = ws[: plan["ticket_region_bytes"]].view(torch.int32)
        assert int((tickets != 0).sum()) == 0, f"M={m} N={n} K={k}: split-K tickets not reset"
    big = K.w4a16_plan(1, 16384, 2048, sms, split_target=2 * sms)
    assert big["n_ctas"] * big["m_blocks"] > 64 and big["splits"] > 1  # a > 64-tile plan really splits


# N < 128, K tails, N % 128; clusters of 2..4 CTAs per tile (K > 4096 with few tiles, a last split
# shorter than the others at (48, 4160))
WARPK_EDGE_CASES = [(48, 48), (48, 336), (640, 2048), (272, 80), (2624, 6144), (512, 6144), (1024, 6144),
                    (48, 4160)]


@pytest.mark.parametrize("n,k", WARPK_EDGE_CASES, ids=[f"N{n}-K{k}" for n, k in WARPK_EDGE_CASES])
def test_warpk_edges_bias_determinism_and_graph(K, n, k):
    """The warp-K kernel on partial 128-row groups, K tails inside a chunk, warps without chunks
    (K = 48: one chunk for 8 warps) and cluster splits, every M it serves, with bias and an out
    buffer; repeated calls and a captured PDL graph give the same bits."""
    q = _weight(n, k, 13 * n + k)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m in range(1, K.WARPK_MAX_M + 1):
        plan = K.w4a16_plan(m, n, k, sms, kernel="warpk")
        assert plan["warpk"] and plan["workspace_bytes"] == 0 and plan["cluster"] == (plan["splits"] > 1), plan
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = K.gemm_w4a16(x, pw, bias=bias, out=out, kernel="warpk")
        assert y.data_ptr() == out.data_ptr()
        ref = x.float() @ wd.t() + bias.float()
        _assert_close(y, ref, x.float().abs() @ wd.abs().t() + bias.float().abs(), f"warpk N={n} K={k} M={m}")
        for pdl in (False, True):
            assert torch.equal(K.gemm_w4a16(x, pw, bias=bias, kernel="warpk", pdl=pdl), y), (m, pdl)
    x_static = torch.randn(5, k, device="cuda").to(torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        want = K.gemm_w4a16(x_static, pw, kernel="warpk").clone()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y_g = K.gemm_w4a16(x_static, pw, kernel="warpk", pdl=True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_g, want)


def test_nan_in_activations_stays_in_its_row(K):
    q = _weight(256, 512, 9)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(8, 512, device="cuda").to(torch.bfloat16)
    x[2, 17] = float("nan")
    y = K.gemm_w4a16(x, pw).float()
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3, 4, 5, 6, 7]]).all()


# ----------------------------------------------------------------------------- bad input

def _bad_inputs(K):
    q = _weight(128, 256, 11)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(4, 256, device="cuda").to(torch.bfloat16)
    gs = torch.tensor([1.0], device="cuda")
    xq, xs = K.quantize_nvfp4(x, gs, mma_order=True)
    return [
        (lambda: K.gemm_w4a16(x.float(), pw), TypeError, "x"),
        (lambda: K.gemm_w4a16(x.cpu(), pw), ValueError, "x"),
        (lambda: K.gemm_w4a16(x[:, :128].contiguous(), pw), ValueError, "x: K"),
        (lambda: K.gemm_w4a16(torch.randn(4, 512, device="cuda").to(torch.bfloat16)[:, ::2], pw), ValueError, "x"),
        (lambda: K.gemm_w4a16(x.view(-1)[1: 1 + 3 * 256].view(3, 256), pw), ValueError, "x must start"),
        (lambda: K.gemm_w4a16(x, q["weight"]), TypeError, "weight"),
        (lambda: K.gemm_w4a16(x, pw, bias=torch.zeros(64, device="cuda", dtype=torch.bfloat16)), ValueError, "bias"),
        (lambda: K.gemm_w4a16(x, pw, out=torch.empty(4, 64, device="cuda", dtype=torch.bfloat16)), ValueError, "out"),
        (lambda: K.gemm_w4a16(x, pw, warps=6), ValueError, "warps"),
        (lambda: K.gemm_w4a16(x, pw, kernel="fast"), ValueError, "kernel"),
        (lambda: K.gemm_w4a16(torch.randn(17, 256, device="cuda").to(torch.bfloat16), pw, kernel="warpk"),
         ValueError, "warpk"),
        (lambda: K.quantize_nvfp4(torch.randn(4, 40, device="cuda").to(torch.bfloat16), gs), ValueError, "x"),
        (lambda: K.quantize_nvfp4(x, torch.tensor([1.0])), ValueError, "global_scale"),
        (lambda: K.quantize_nvfp4(x, torch.ones(2, device="cuda")), ValueError, "global_scale"),
        (lambda: K.quantize_nvfp4(x, gs.double()), TypeError, "global_scale"),
        (lambda: K.gemm_w4a4(xq, xs[:64], gs, pw), ValueError, "x_scales"),
        (lambda: K.gemm_w4a4(xq[:, :64], xs, gs, pw), ValueError, "xq"),
        (lambda: K.gemm_w4a4(xq, xs, gs, pw, mode="fast"), ValueError, "mode"),
        (lambda: K.pack_weight(q["weight"], q["weight_scale"][:, :8], q["weight_scale_2"]), ValueError, "weight_scale"),
        (lambda: K.pack_weight(q["weight"], q["weight_scale"], -1.0), ValueError, "weight_scale_2"),
        (lambda: K.pack_weight(q["weight"].float(), q["weight_scale"], 1.0), TypeError, "weight"),
    ]


def test_bad_input_raises_naming_the_argument(K):
    for i, (call, exc, word) in enumerate(_bad_inputs(K)):
        with pytest.raises(exc, match=word):
            call()
    torch.cuda.synchronize()  # nothing bad reached the device


def test_hardware_mode_off_sm120_is_a_clear_error(K):
    if torch.cuda.get_device_capability()[0] == 12:
        pytest.skip("this GPU has the FP4 MMA")
    q = _weight(128, 256, 12)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x = torch.randn(4, 256, device="cuda").to(torch.bfloat16)
    gs = torch.tensor([1.0], device="cuda")
    xq, xs = K.quantize_nvfp4(x, gs, mma_order=True)
    with pytest.raises(RuntimeError, match="SM120"):
        K.gemm_w4a4(xq, xs, gs, pw, mode="hardware")


# ----------------------------------------------------------------------------- fp4_linear glue

def _modelopt_layer(n_parts, k, seed):
    """A linear layer as upstream's ModelOptFp4LinearMethod.create_weights + loading leave it:
    fused partitions sharing one weight_scale_2, per-partition input_scale."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(sum(n_parts), k, device="cuda", generator=g) * 0.03
    q = F.quantize_weight_modelopt(w)
    layer = torch.nn.Module()
    # Clones: with upstream sglang importable, process_weights_after_loading repacks through
    # copy_or_rebind_param, which copies into the existing parameter when the shape matches, so
    # sharing q's storage would overwrite the reference weights (the H200 run of 2026-12-01).
    layer.weight = torch.nn.Parameter(q["weight"].clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(q["weight_scale"].clone(), requires_grad=False)
    layer.weight_scale_2 = torch.nn.Parameter(q["weight_scale_2"].repeat(len(n_parts)), requires_grad=False)
    layer.input_scale = torch.nn.Parameter(torch.tensor([0.002, 0.003][: len(n_parts)] + [0.002] * (len(n_parts) - 2),
                                                        device="cuda"), requires_grad=False)
    layer.output_size_per_partition = sum(n_parts)
    layer.input_size_per_partition = k
    return layer, q


def test_fp4_linear_process_and_apply(K):
    from sglang.sm120 import fp4_layer, fp4_linear

    layer, q = _modelopt_layer([1024, 256, 256], 2048, 21)  # qkv-like fused layer, N = 1536
    fp4_linear.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.uint8 and layer.output_size_per_partition == 1536
    wd = _exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    in_s = layer.sm120_input_scale.item()
    assert in_s == pytest.approx(0.003)
    bias = torch.randn(1536, device="cuda").to(torch.bfloat16)
    for m in (1, 7, 64, 65, 300):
        x = (torch.randn(m, 2048, device="cuda") * 2).to(torch.bfloat16)
        y = fp4_linear.apply(layer, x.view(1, m, 2048), bias)
        assert y.shape == (1, m, 1536) and y.dtype == torch.bfloat16
        if fp4_layer.uses_w4a16(m):
            ref = x.float() @ wd.t()
            absref = x.float().abs() @ wd.abs().t()
        else:
            xd = _exact_dequant(*F.quantize_nvfp4(x, 1.0 / torch.tensor(in_s)), in_s)
            ref, absref = xd @ wd.t(), xd.abs() @ wd.abs().t()
        _assert_close(y.view(m, 1536), ref + bias.float(), absref + bias.float().abs(), f"fp4_linear M={m}")
    assert fp4_linear.apply(layer, torch.empty(0, 2048, device="cuda", dtype=torch.bfloat16)).shape == (0, 1536)
