"""Every results JSON in benchmarks/results/ (gpu-logs included) carries a top-level "targets"
object, each entry {"value", "target", "met"}, so a reader sees at a glance what was met."""
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[3]


def test_every_results_json_has_a_targets_object():
    files = sorted((REPO / "benchmarks" / "results").rglob("*.json"))
    assert files, "no results files found"
    bad = []
    for f in files:
        doc = json.loads(f.read_text())
        targets = doc.get("targets") if isinstance(doc, dict) else None
        if not isinstance(targets, dict):
            bad.append(f"{f.relative_to(REPO)}: no top-level targets object")
            continue
        for name, t in targets.items():
            if not (isinstance(t, dict) and {"value", "target", "met"} <= set(t)):
                bad.append(f"{f.relative_to(REPO)}: target {name} lacks value/target/met")
    assert not bad, "\n".join(bad)
