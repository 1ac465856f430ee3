"""Patches 0107, 0109 and 0111: in Dynamo-free mode the seeded sampler, the repetition penalty,
the vocab-parallel mask and the overlap debug assert give what Inductor compiles from them, bit
for bit (the installed patched tree; Inductor's CPU backend as the oracle, see
test/cpu/dynamo_free_cases.py and runner/dynamo_free.py for what it does not show of the GPU)."""
import pytest

pytest.importorskip("sglang.srt.layers.sampler")
import dynamo_free_cases as dfc  # noqa: E402

CASES = dfc.sampling_cases() + dfc.overlap_cases() + dfc.vocab_cases()


@pytest.fixture(scope="module")
def results(one_thread):
    with dfc.cpu_inductor_settings(), dfc.stand_ins():
        return dfc.compare(CASES)


@pytest.mark.parametrize("key", [dfc.key(c) for c in CASES])
def test_dynamo_free_form_gives_the_compiled_bits(results, key):
    r = results[key]
    assert r["dynamo_frames_eager"] == 0, r
    assert r["equal"], r["diff"]
