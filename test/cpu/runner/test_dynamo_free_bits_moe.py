"""Patch 0106: in Dynamo-free mode moe_sum_reduce, the SwiGLU variants, the top-k id
post-processing and the waterfill expansion give what Inductor compiles from them, bit for bit
(moe_sum_reduce and the SwiGLU variants through their eager twins). Inductor's CPU backend is the
oracle (test/cpu/dynamo_free_cases.py; runner/dynamo_free.py says what it does not show of the
GPU). The top-k fallbacks are not reproduced (dynamo_free_cases.NOT_REPRODUCED)."""
import pytest

pytest.importorskip("sglang.srt.layers.moe.topk")
import dynamo_free_cases as dfc  # noqa: E402

CASES = [c for c in dfc.moe_cases() if c.bits]

results, test_dynamo_free_form_gives_the_compiled_bits = dfc.bit_tests(CASES)


@pytest.mark.parametrize("helper", ["moe_sum_reduce_torch_compile [torch.bfloat16 29x4x2048 scale 2.5",
                                    "_swiglu_silu_clamp_mul", "swiglu_gpt_oss_sigmoid_alpha",
                                    "swiglu_no_interleaved_with_alpha_and_limit"])
def test_the_plain_body_differs_so_the_twin_is_needed(results, helper):
    plain = [r["plain_equal"] for k, r in results.items() if helper in k]
    assert plain and False in plain, (helper, plain)
