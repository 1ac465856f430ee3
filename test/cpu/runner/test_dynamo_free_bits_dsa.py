"""Patch 0108: in Dynamo-free mode the DSA indexer's head-gate helpers (and IndexerKPool's on
0.5.23) and dsa_backend._compiled_cat give what Inductor compiles from them, bit for bit: fp32
products in upstream's order and a concatenation, so the plain bodies. Inductor's CPU backend is
the oracle (test/cpu/dynamo_free_cases.py); the projection is a stand-in GEMM (on CUDA Inductor
calls the same extern mm as eager)."""
import pytest

pytest.importorskip("sglang.srt.layers.attention.dsa.dsa_indexer")
import dynamo_free_cases as dfc  # noqa: E402

CASES = dfc.dsa_cases(dfc.installed_base())

results, test_dynamo_free_form_gives_the_compiled_bits = dfc.bit_tests(CASES)
