"""lab/compare_fp4.py (the A/B report of two kernel libraries) on synthetic result files."""
import json

import pytest
import repo_scripts

pytestmark = pytest.mark.base_independent


@pytest.fixture(scope="module")
def cmp():
    return repo_scripts.load("lab/compare_fp4.py")


def _write(path, rows):
    path.write_text(json.dumps({"rows": [
        {"shape": s, "M": m, "ours_us": t, "ours_pdl_us": t * 0.8, "marlin_us": marlin} for s, m, t, marlin in rows]}))
    return path


def test_ratios_marlin_counts_and_spread(tmp_path, cmp):
    base = _write(tmp_path / "old.json", [("a", 1, 10.0, 11.0), ("a", 16, 10.0, 13.0), ("b", 64, 20.0, 20.0)])
    n1 = _write(tmp_path / "n1.json", [("a", 1, 8.0, 11.0), ("a", 16, 10.0, 13.0), ("b", 64, 22.0, 20.0)])
    n2 = _write(tmp_path / "n2.json", [("a", 1, 9.0, 11.0), ("a", 16, 10.0, 13.0), ("b", 64, 22.0, 20.0)])
    rows = cmp.compare(cmp.load(base), [cmp.load(n1), cmp.load(n2)])
    by = {(r["shape"], r["M"]): r for r in rows}
    assert by[("a", 1)]["ours_us_ratio"] == pytest.approx(0.85)  # mean of the new runs / base
    assert by[("a", 1)]["ours_us_spread"] == pytest.approx(1.0 / 8.5)
    assert by[("b", 64)]["ours_pdl_us_ratio"] == pytest.approx(1.1)
    text = cmp.report(rows, "old.json", ["n1.json", "n2.json"])
    # M <= 16 judged on each file's own Marlin column: a@1 1.10x -> 1.30x (geomean of 11/8 and 11/9), a@16 1.30x both
    assert "rows below 1.2x 1 -> 0 of 2" in text and "min 1.10 -> 1.30" in text
    assert "| 32-128 | 1.100 |" in text and "| 1-8 | 0.850 |" in text


def test_files_without_common_rows_are_refused(tmp_path, cmp):
    a = _write(tmp_path / "a.json", [("a", 1, 1.0, None)])
    b = _write(tmp_path / "b.json", [("b", 1, 1.0, None)])
    with pytest.raises(SystemExit, match="share no"):
        cmp.main(["--base", str(a), "--new", str(b)])
