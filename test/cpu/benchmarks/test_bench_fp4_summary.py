"""bench_fp4_gemm's targets without a GPU: the launch-floor bound beside each target and the split
sweep's summary, on synthetic rows."""
import pytest
import repo_scripts

pytestmark = pytest.mark.base_independent


@pytest.fixture(scope="module")
def bench():
    return repo_scripts.load("benchmarks/bench_fp4_gemm.py")


def _row(bench, n, k, m, ours, bf16, marlin, floor_us=2.0, copy_bw=4e12, sweep=None):
    r = {"shape": f"{n}x{k}", "N": n, "K": k, "M": m, "weight_fp4_bytes": int(0.5625 * n * k),
         "ours_us": ours, "ours_pdl_us": ours, "bf16_us": bf16, "marlin_us": marlin,
         "speedup_vs_bf16": bf16 / ours, "speedup_vs_bf16_pdl": bf16 / ours,
         "speedup_vs_bf16_cluster_pdl": bf16 / ours, "speedup_vs_marlin": marlin / ours,
         "split_target_pdl_us": sweep or {}}
    r["ours_bw_pct"] = r["ours_pdl_bw_pct"] = 100 * bench.fp4_bytes(n, k, m) / (ours * 1e-6) / copy_bw
    bench.add_floor_bounds(r, floor_us, copy_bw)
    return r


def test_floor_bound_is_the_floor_plus_the_bytes_at_copy_bandwidth(bench):
    r = _row(bench, 6144, 16384, 1, ours=30.0, bf16=54.0, marlin=31.0)
    nbytes = bench.fp4_bytes(6144, 16384, 1)
    assert r["at_floor_us"] == pytest.approx(2.0 + nbytes / 4e12 * 1e6)
    assert r["at_floor_bw_pct"] == pytest.approx(100 * (nbytes / 4e12 * 1e6) / r["at_floor_us"])
    assert r["at_floor_speedup_vs_bf16"] == pytest.approx(54.0 / r["at_floor_us"])
    assert r["at_floor_speedup_vs_marlin"] == pytest.approx(31.0 / r["at_floor_us"])


def test_targets_carry_the_floor_bound_and_count_unreachable_rows(bench):
    # a 1 MB weight at the floor cannot be 3x faster than a 4.4 us bf16 call; a 56 MB one can
    small = _row(bench, 2048, 1024, 1, ours=4.4, bf16=4.4, marlin=11.6)
    big = _row(bench, 6144, 16384, 1, ours=26.6, bf16=54.0, marlin=30.8)
    targets, _ = bench.summarize([small, big], None)
    t = targets["speedup_vs_bf16_m_1_to_8_min"]
    assert t["value"] == pytest.approx(1.0) and t["met"] is False and t["rows"] == 2
    assert t["rows_unreachable_at_floor"] == 1
    assert t["at_floor_bound"] == pytest.approx(round(small["at_floor_speedup_vs_bf16"], 2))
    bw = targets["bw_pct_of_copy_m_le_16_weights_ge_8MB_min"]
    assert bw["rows"] == 1  # only the 56 MB weight is >= 8 MB
    assert bw["value"] == pytest.approx(round(big["ours_bw_pct"], 2))
    for v in targets.values():
        assert set(v) >= {"value", "target", "met"}


def test_marlin_target_names_why_it_is_missing(bench):
    r = _row(bench, 2048, 1024, 1, ours=4.4, bf16=4.4, marlin=11.6)
    r["speedup_vs_marlin"] = r["marlin_us"] = r["at_floor_speedup_vs_marlin"] = None
    targets, _ = bench.summarize([r], "not importable")
    t = targets["speedup_vs_marlin_m_le_16_min"]
    assert t["value"] is None and t["met"] is False and t["missing"] == "not importable"


def test_split_sweep_summary_is_a_geomean_per_m_range(bench):
    rows = [_row(bench, 5120, 2048, m, ours=8.0, bf16=9.0, marlin=10.0,
                 sweep={"0.25x": 4.0, "0.5x": 8.0, "1x": 16.0}) for m in (1, 2)]
    rows.append(_row(bench, 5120, 2048, 64, ours=8.0, bf16=9.0, marlin=10.0, sweep={"0.5x": 4.0}))
    _, extra = bench.summarize(rows, None)
    assert extra["pdl_split_target_0.25x_vs_default_time_m1_8_geomean"] == pytest.approx(0.5)
    assert extra["pdl_split_target_1x_vs_default_time_m1_8_geomean"] == pytest.approx(2.0)
    assert extra["pdl_split_target_0.5x_vs_default_time_m32_128_geomean"] == pytest.approx(0.5)
    assert extra["pdl_split_target_0.25x_vs_default_time_m16_16_geomean"] is None


def test_warps_columns_mark_the_count_the_default_ran(bench):
    r = _row(bench, 16384, 2048, 16, ours=11.0, bf16=20.0, marlin=11.0)
    r["ours_4w_us"], r["ours_4w_pdl_us"] = 11.0, 10.5
    r["ours_8w_us"], r["ours_8w_pdl_us"] = 5.5, 5.0
    assert bench.warps_cols(dict(r, default_warps=8)) == "4w 11.00/10.50 / 8w* 5.50/5.00"
    assert bench.warps_cols(dict(r, default_warps=4)) == "4w* 11.00/10.50 / 8w 5.50/5.00"
    assert bench.warps_cols(_row(bench, 512, 512, 1, ours=3.0, bf16=4.0, marlin=4.0)) == ""
