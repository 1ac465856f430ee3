"""Patches 0110 and 0112: in Dynamo-free mode FP4 KV quantize / dequantize and the native rope give
what Inductor compiles from them, bit for bit: quantize and rope through their eager twins
(fp32 math, one rounding), whose need the plain bodies show here (they differ). Inductor's CPU
backend is the oracle (test/cpu/dynamo_free_cases.py; runner/dynamo_free.py says what it does not
show of the GPU)."""
import pytest
import torch

pytest.importorskip("sglang.srt.layers.quantization.kvfp4_tensor")
import dynamo_free_cases as dfc  # noqa: E402

CASES = dfc.kv_cases() + dfc.rope_cases()

results, test_dynamo_free_form_gives_the_compiled_bits = dfc.bit_tests(CASES)


@pytest.mark.parametrize("helper", ["batched_quantize [torch.bfloat16", "batched_quantize [torch.float16",
                                    "RotaryEmbedding.__init__ [torch.bfloat16",
                                    "RotaryEmbedding.__init__ [torch.float16"])
def test_the_plain_body_differs_so_the_twin_is_needed(results, helper):
    plain = [r["plain_equal"] for k, r in results.items() if helper in k]
    assert plain and False in plain, (helper, plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gpu_division_by_six_picks_the_same_scale_exponent_for_every_block_maximum(dtype):
    """Inductor divides by a constant on CPUs and multiplies by its reciprocal on GPUs; for every
    positive finite bf16 / fp16 block maximum both give the same ceil(log2(max / 6)), so the
    quantize twin matches either."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    m = every[torch.isfinite(every) & (every > 0)].float()
    divided = torch.ceil(torch.log2(torch.clamp(m / 6.0, min=1e-10)))
    multiplied = torch.ceil(torch.log2(torch.clamp(m * (1.0 / 6.0), min=1e-10)))
    assert m.numel() > 30000 and torch.equal(divided, multiplied)
