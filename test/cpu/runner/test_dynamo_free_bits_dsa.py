"""Patch 0108: in Dynamo-free mode the DSA indexer's head-gate helpers (and IndexerKPool's on
0.5.23) and dsa_backend._compiled_cat give what Inductor compiles from them, bit for bit: fp32
products in upstream's order and a concatenation, so the plain bodies. Inductor's CPU backend is
the oracle (test/cpu/dynamo_free_cases.py); the projection is a stand-in GEMM (on CUDA Inductor
calls the same extern mm as eager)."""
import pytest

pytest.importorskip("sglang.srt.layers.attention.dsa.dsa_indexer")
import dynamo_free_cases as dfc  # noqa: E402

CASES = dfc.dsa_cases(dfc.installed_base())


@pytest.fixture(scope="module")
def results(one_thread):
    with dfc.cpu_inductor_settings(), dfc.stand_ins():
        return dfc.compare(CASES)


@pytest.mark.parametrize("key", [dfc.key(c) for c in CASES])
def test_dynamo_free_form_gives_the_compiled_bits(results, key):
    r = results[key]
    assert r["dynamo_frames_eager"] == 0, r
    assert r["equal"], r["diff"]
