"""Do a linear layer's real rows get the same bits at a padded batch? (issue 43; GPU, a probe)

Layerwise replays decode graphs captured at padded batch sizes (300 requests run the 320-row
graph), graphs disabled runs the real batch. The H100 probe of session 13 found 27 more
sequences differing at 300 requests padded to 320 than at exactly 300, 12 more at 520 -> 576, none
at 1000 -> 1024; upstream's own full graphs at padded sizes showed the same. Two candidates: the
decode attention plan (FlashInfer sizes its KV split from every row, padded ones included) and
the GEMMs (cuBLAS picks its kernel, split-K included, by M, so a row's dot products may be summed
in another order at another M). This test measures the second alone: per shape and (real, padded)
row count, F.linear on the real rows against the first real rows of F.linear on the padded rows,
bit for bit, bf16 as served. Shapes: the tiny glm4_moe's projections (hidden 256), Qwen3-30B-A3B's
and GLM-5 TP-8's (runner shapes, model_shapes.projection_shapes); and the MoE router's gate, which
glm4_moe computes in fp32 with TF32 on (upstream enables it for that model): a flipped expert
choice changes a token's whole MoE output.

With SGLANG_SM120_RESULTS_DIR it writes padded-rows-bits-gpu.json there. It asserts nothing about
the answer (either is a finding); it fails only if it cannot measure.

    SGLANG_SM120_RESULTS_DIR=$OUT PYTHONPATH=/tmp/site python3 -m pytest -q test/gpu/test_padded_rows_bits_gpu.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu]

# (real rows, the size layerwise or upstream's graphs pad them to)
PAIRS = ((17, 24), (33, 40), (200, 200), (300, 304), (300, 320), (520, 576), (1000, 1024))


def _shapes():
    from sglang.sm120.model_shapes import projection_shapes
    from sglang.sm120.tiny.spec import default_spec

    s = default_spec("glm4_moe")
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    tiny = [("tiny glm4_moe qkv", q + 2 * kv, s.hidden), ("tiny glm4_moe o_proj", s.hidden, q),
            ("tiny glm4_moe dense gate_up", 2 * s.dense_intermediate, s.hidden),
            ("tiny glm4_moe dense down", s.hidden, s.dense_intermediate)]
    real = [x for x in projection_shapes(tps=(1, 8))
            if ("qwen3" in x[0] and "tp1" in x[0]) or ("glm5" in x[0] and "tp8" in x[0])]
    return [(name, n, k, torch.bfloat16) for name, n, k in tiny + real] + [
        ("tiny glm4_moe router gate (fp32, TF32)", s.experts, s.hidden, torch.float32),
        ("glm5 router gate (fp32, TF32)", 256, 6144, torch.float32)]


def test_real_rows_keep_their_bits_at_the_padded_batch():
    if not torch.cuda.is_available():
        pytest.fail("needs a CUDA GPU")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # what the glm4_moe server sets (fp32 gate)
    try:
        results = _measure()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    out = os.environ.get("SGLANG_SM120_RESULTS_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "padded-rows-bits-gpu.json").write_text(json.dumps(
            {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": results}, indent=1) + "\n")
    differ = [k for k, v in results.items() if not v["identical"]]
    print(f"{len(results) - len(differ)} of {len(results)} cases identical; differ: {differ}")
    assert results


def _measure() -> dict:
    results = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n, k, dtype in _shapes():
        w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).to(dtype)
        ints = torch.int16 if dtype == torch.bfloat16 else torch.int32
        for real, padded in PAIRS:
            x = torch.randn(padded, k, generator=g, device="cuda").to(dtype)
            x[real:] = 0  # padded rows hold whatever the buffers hold; zero is one such content
            alone = torch.nn.functional.linear(x[:real].contiguous(), w)
            inside = torch.nn.functional.linear(x, w)[:real]
            torch.cuda.synchronize()
            same = torch.equal(alone.view(ints), inside.view(ints))
            results[f"{name} N{n} K{k} rows {real} in {padded}"] = {
                "identical": same, "differing_values": 0 if same else int((alone != inside).sum())}
    return results
