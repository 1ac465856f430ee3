"""GEMM timing harness shared by `python -m sglang.sm120 check` and benchmarks/bench_fp4_gemm.py.

Every time is the median of CUDA-graph replays of one op per rotating weight copy (copies together
larger than 2.5x L2, so every call reads its weights from memory), divided by the number of ops.
Bandwidth is bytes moved over that time, as a fraction of a device-to-device copy measured on the
same GPU in the same run.
"""
from __future__ import annotations

import math
import statistics

import torch


def shapes():
    from sglang.sm120.model_shapes import projection_shapes

    return projection_shapes()


def select_shapes(spec, sel=None):
    """The shapes (of `sel`, default all) whose names contain any comma-separated substring of
    `spec`; all of them for an empty spec."""
    want = [w.strip() for w in spec.split(",") if w.strip()]
    sel = shapes() if sel is None else sel
    return [s for s in sel if any(w in s[0] for w in want)] if want else sel


def shape_weight(n, k):
    """The benchmark's fp32 weight of an (N, K) shape and its NVFP4 quantization (modelopt format),
    seeded by the shape, so that every tool times the benchmark's values."""
    from sglang.sm120 import nvfp4 as F

    torch.manual_seed(n * 31 + k)
    w = torch.randn(n, k, device="cuda") * 0.02
    return w, F.quantize_weight_modelopt(w)


def fp4_bytes(n, k, m):
    return 0.5625 * n * k + 2 * m * k + 2 * m * n


def bf16_bytes(n, k, m):
    return 2 * n * k + 2 * m * k + 2 * m * n


_STREAM = None


def bench_device():
    """The properties of GPU 0 for a kernel benchmark, or SystemExit with one line where there is
    no GPU or no kernel library. TF32 off: the bf16 baselines are plain bf16 products."""
    from sglang.sm120 import kernels

    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA GPU")
    if not kernels.available():
        raise SystemExit("error: libsm120_kernels.so not built: PYTHONPATH=python python3 -m forkbuild.kernels "
                         "--out python/sglang/sm120/kernels/lib")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch.cuda.get_device_properties(0)


def time_ops(ops, reps):
    """Median microseconds per op: CUDA-graph replays of all ops (one per rotating weight copy)."""
    global _STREAM
    if _STREAM is None:
        _STREAM = torch.cuda.Stream()  # one capture stream: one split-K workspace for the whole run
    stream = _STREAM
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for op in ops[:2]:
            op()  # JIT / workspace creation on the capture stream, outside capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for op in ops:
            op()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / len(ops))
    del graph
    return statistics.median(times)


def copy_bandwidth(log, nbytes=1 << 30):
    """Bytes read + written per second of the fastest device-to-device copy of `nbytes`. cudaMemcpy
    alone under-reads the H200 (a bf16 GEMM read its weights faster than it copied), so a
    vectorized elementwise kernel is timed too and the faster one is the denominator."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    s32, d32 = src.view(torch.int32), dst.view(torch.int32)
    ways = {"memcpy": lambda: dst.copy_(src), "elementwise": lambda: torch.bitwise_not(s32, out=d32)}
    by_way = {name: 2 * nbytes / (time_ops([op], reps=20) * 1e-6) for name, op in ways.items()}
    bw = max(by_way.values())
    log(f"copy bandwidth ({nbytes >> 20} MiB device-to-device, read + write): " + ", ".join(
        f"{k} {v / 1e12:.2f} TB/s" for k, v in by_way.items()))
    del src, dst
    torch.cuda.empty_cache()
    return bw, {k: round(v / 1e12, 3) for k, v in by_way.items()}


def launch_floor_us(reps):
    """Per-call time of a one-element kernel in the same graph chain: what any kernel pays per call
    here before moving a byte (launch, scheduling, drain)."""
    t = torch.zeros(1, device="cuda")
    return time_ops([lambda: t.add_(1.0)] * 16, reps)


def copies_for(nbytes, l2):
    return max(2, math.ceil(2.5 * l2 / max(nbytes, 1)))


def rotating_weights(pw, l2):
    """pw and enough clones of it (> 2x L2 in all) that a graph cycling through them reads every
    call's weights from HBM."""
    from sglang.sm120 import kernels as K

    return [pw] + [K.PackedWeight(pw.qweight.clone(), pw.scales.clone(), pw.weight_scale_2.clone(), pw.n, pw.k)
                   for _ in range(copies_for(0.5625 * pw.n * pw.k, l2) - 1)]


def load_marlin(log):
    try:
        from sglang.srt.layers.quantization.marlin_utils_fp4 import (  # noqa: F401
            apply_fp4_marlin_linear, prepare_nvfp4_layer_for_marlin)
        return (apply_fp4_marlin_linear, prepare_nvfp4_layer_for_marlin), None
    except Exception as exc:  # ImportError, or the JIT machinery failing to import
        reason = f"upstream sglang Marlin FP4 not importable: {type(exc).__name__}: {exc}".splitlines()[0]
        log(reason)
        return None, reason


def marlin_layer(q, n, k, prepare):
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(q["weight"].clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(q["weight_scale"].clone(), requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(q["weight_scale_2"].reshape(()).clone(), requires_grad=False)
    layer.output_size_per_partition = n
    layer.input_size_per_partition = k
    layer.params_dtype = torch.bfloat16
    prepare(layer)
    return layer


def marlin_copies(q, n, k, prepare, count):
    """`count` Marlin layers of one FP4 weight (a prepared layer and clones of its repacked tensors),
    cycled like the rotating copies of ours."""
    base = marlin_layer(q, n, k, prepare)
    layers = [base]
    for _ in range(count - 1):
        c = torch.nn.Module()
        c.weight, c.weight_scale = base.weight.clone(), base.weight_scale.clone()
        c.weight_global_scale, c.workspace = base.weight_global_scale, base.workspace
        layers.append(c)
    return layers


def marlin_ops(apply, layers, x, n, k):
    """One upstream apply_fp4_marlin_linear call per Marlin layer copy, on x."""
    return [lambda L=L: apply(input=x, weight=L.weight, weight_scale=L.weight_scale,
                              weight_global_scale=L.weight_global_scale, workspace=L.workspace, size_n=n, size_k=k)
            for L in layers]
