"""Patches 0107, 0109 and 0111: in Dynamo-free mode the seeded sampler, the repetition penalty,
the vocab-parallel mask and the overlap debug assert give what Inductor compiles from them, bit
for bit (the installed patched tree; Inductor's CPU backend as the oracle, see
test/cpu/dynamo_free_cases.py and runner/dynamo_free.py for what it does not show of the GPU)."""
import pytest

pytest.importorskip("sglang.srt.layers.sampler")
import dynamo_free_cases as dfc  # noqa: E402

CASES = dfc.sampling_cases() + dfc.overlap_cases() + dfc.vocab_cases()

results, test_dynamo_free_form_gives_the_compiled_bits = dfc.bit_tests(CASES)
