"""benchmarks/prefill_profile.py's trace reading without a GPU."""
import gzip
import json

import pytest
import repo_scripts

pytestmark = pytest.mark.base_independent


@pytest.fixture(scope="module")
def prof():
    return repo_scripts.load("benchmarks/prefill_profile.py")


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_span_busy_idle_and_groups(prof):
    events = [
        _k("fused_moe_kernel", 0, 10), _k("fused_moe_kernel", 5, 10),  # overlapping: busy 15, not 20
        _k("BatchPrefillWithRaggedKVCacheKernel", 30, 20),
        _k("nvjet_tst_128x256", 60, 5), _k("Memcpy DtoD", 65, 5, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000},  # host: not counted
    ]
    s = prof.summarize_trace(events)
    assert (s["span_us"], s["busy_us"], s["idle_us"], s["kernels"]) == (70.0, 45.0, 25.0, 5)
    assert s["by_group_us"] == {"moe": 20.0, "attention": 20.0, "gemm": 5.0, "copy": 5.0}
    assert s["top"][0] == {"name": "fused_moe_kernel", "calls": 2, "total_us": 20.0}
    assert prof.summarize_trace([events[-1]]) == {"kernels": 0}


def test_trace_file_names_give_the_token_count_and_gz_reads(prof, tmp_path):
    m = prof.TRACE_RE.search("layerwise_batch32_input128_output8_prefill.trace.json.gz")
    assert int(m.group(1)) * int(m.group(2)) == 4096
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [_k("x", 0, 1)]}, f)
    assert prof.read_trace(path) == [_k("x", 0, 1)]


def test_md_has_one_row_per_config_and_size(prof):
    s = prof.summarize_trace([_k("fused_moe_kernel", 0, 1000), _k("rmsnorm", 2000, 1000)])
    doc = {"tag": "t", "device": "H200", "model": "m", "commit": "c", "generated": "g",
           "runs": {"upstream": {"tokens": {"1024": s}}, "layerwise": {"tokens": {"1024": s}}}}
    md = prof.render_md(doc)
    assert "| layerwise | 1024 | 3.00 | 2.00 | 1.00 | 2 | moe 1.00, norm 1.00 |" in md
    assert md.count("largest kernels") == 2
