"""The results of record: benchmarks/records.toml names one per benchmark, every file under
benchmarks/results/ is named there, every results JSON carries a non-empty "targets" object
({name: {value, target, met}}), docs/status.md is what benchmarks/status.py generates from them,
and the tracked tree stays small (records of old runs live in git history, tag records-archive).

Each check also runs on a broken temporary copy, to show that it fails."""
import gzip
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.base_independent

REPO = Path(__file__).resolve().parents[3]
# A GPU host call carries 64 MiB: a wheelhouse part (~56 MB) beside the tree, and old records
# belong in git history (docs/history.md), not here.
TREE_LIMIT_BYTES = 3_000_000


def _status():
    spec = importlib.util.spec_from_file_location("records_status", REPO / "benchmarks" / "status.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy(tmp_path: Path) -> Path:
    """The registry, the results and the status page, in a repository-shaped temporary folder."""
    (tmp_path / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "benchmarks" / "records.toml", tmp_path / "benchmarks")
    shutil.copytree(REPO / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    shutil.copy(REPO / "docs" / "status.md", tmp_path / "docs")
    return tmp_path


def _results_json(root: Path):
    return sorted(p for p in (root / "benchmarks" / "results").rglob("*")
                  if p.name.endswith((".json", ".json.gz")))


def _targets_problems(root: Path, status) -> list:
    bad = []
    for f in _results_json(root):
        doc = status.read_doc(f)
        targets = doc.get("targets") if isinstance(doc, dict) else None
        if not isinstance(targets, dict) or not targets:
            bad.append(f"{f.name}: no non-empty top-level targets object")
            continue
        bad += [f"{f.name}: target {k} lacks value/target/met" for k, t in targets.items()
                if not (isinstance(t, dict) and {"value", "target", "met"} <= set(t))]
    return bad


def test_every_results_json_has_non_empty_targets(tmp_path):
    status = _status()
    assert _results_json(REPO), "no results files found"
    assert _targets_problems(REPO, status) == []
    # a record whose targets are empty, one whose target lacks `met`: both reported
    root = _copy(tmp_path)
    (root / "benchmarks/results/soak-h200.json.gz").write_bytes(gzip.compress(json.dumps({"targets": {}}).encode()))
    runner = root / "benchmarks/results/runner-h200.json.gz"
    doc = status.read_doc(runner)
    del doc["targets"]["decode_speedup_vs_eager_bs512"]["met"]
    runner.write_bytes(gzip.compress(json.dumps(doc).encode()))
    bad = _targets_problems(root, status)
    assert any(b.startswith("soak-h200.json.gz: no non-empty") for b in bad), bad
    assert any("decode_speedup_vs_eager_bs512 lacks" in b for b in bad), bad


def test_one_record_per_benchmark_and_every_file_registered(tmp_path):
    status = _status()
    assert status.problems(REPO) == []
    # a second result of record beside the first (a suffixed copy), and a benchmark registered twice
    root = _copy(tmp_path)
    shutil.copy(root / "benchmarks/results/runner-h200.json.gz", root / "benchmarks/results/runner-h200-s2.json.gz")
    reg = root / "benchmarks/records.toml"
    text = reg.read_text()
    first = text.index("[[record]]")
    block = text[first:text.index("[[record]]", first + 1)]
    reg.write_text(text + "\n" + block.replace('file = "benchmarks/results/runner-h200.json.gz"',
                                               'file = "benchmarks/results/runner-h200-s2.json.gz"'))
    bad = status.problems(root)
    assert "benchmark runner-h200 has 2 records" in bad, bad
    shutil.copy(REPO / "benchmarks/records.toml", reg)
    bad = status.problems(root)
    assert bad == ["benchmarks/results/runner-h200-s2.json.gz is not named in benchmarks/records.toml"], bad


def test_status_page_is_generated_from_the_registry_and_files(tmp_path):
    status = _status()
    page = (REPO / "docs" / "status.md").read_text()
    assert status.render(REPO) == page, "docs/status.md is stale: python benchmarks/status.py --write"
    assert page.count("\n| [") == len(status.registry(REPO))  # one row per benchmark
    # a record whose value changed: the stored page no longer matches
    root = _copy(tmp_path)
    soak = root / "benchmarks/results/soak-h200.json.gz"
    doc = json.loads(gzip.decompress(soak.read_bytes()))
    doc["targets"]["gpu_memory_drift_pct"]["value"] = 7.5
    soak.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert status.render(root) != (root / "docs/status.md").read_text()


def _tracked_bytes(root: Path) -> int:
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    return sum((root / p).stat().st_size for p in out.decode().split("\0") if p and (root / p).is_file())


def test_tracked_tree_is_small(tmp_path):
    try:
        subprocess.run(["git", "-C", str(REPO), "rev-parse", "--show-toplevel"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (e.g. an unpacked sdist)")
    size = _tracked_bytes(REPO)
    assert size < TREE_LIMIT_BYTES, f"tracked files hold {size} bytes (limit {TREE_LIMIT_BYTES}); old records belong in git history"
    # a repository holding one 3 MB file is over the limit
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "big.log").write_bytes(b"x" * TREE_LIMIT_BYTES)
    subprocess.run(["git", "-C", str(tmp_path), "add", "big.log"], check=True)
    assert _tracked_bytes(tmp_path) >= TREE_LIMIT_BYTES


def test_take_copies_a_runs_outputs_to_the_record_paths(tmp_path):
    """`status.py --take RESULTS`: each registered output (and its report and log) found in a run's
    folder becomes the record, compressed where the record is .gz; the records' own contents laid
    out as a run would write them come back unchanged."""
    status = _status()
    run = tmp_path / "run"
    for e in status.registry(REPO):
        if not e.get("output"):
            continue
        out = run / e["output"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(json.dumps(status.read_doc(REPO / e["file"])).encode())
        if e.get("md"):
            shutil.copy(REPO / e["md"], out.with_suffix(".md"))
    root = _copy(tmp_path / "repo")
    for f in (root / "benchmarks/results").glob("*.json*"):
        f.unlink()
    taken = status.take(run, root)
    assert len(taken) == sum(1 for e in status.registry(REPO) if e.get("output")) >= 15
    for e in status.registry(REPO):
        if e.get("output"):
            assert status.read_doc(root / e["file"]) == status.read_doc(REPO / e["file"]), e["name"]
            assert (root / e["file"]).name.endswith(".gz") == e["file"].endswith(".gz")
    assert status.take(tmp_path / "empty", root) == []


def test_take_refuses_an_output_from_another_gpu_model(tmp_path):
    """A run on an H100 does not become a record whose hardware is an H200 (nor the reverse); the
    GPU comes from the queue's gpu.txt, else from the output's own device field."""
    status = _status()
    entry = next(e for e in status.registry(REPO) if e.get("output") and status.gpu_model(e["hardware"]))
    want = status.gpu_model(entry["hardware"])
    other = "H100" if want != "H100" else "H200"
    root = _copy(tmp_path / "repo")
    before = (root / entry["file"]).read_bytes()
    run = tmp_path / "run"
    out = run / entry["output"]
    out.parent.mkdir(parents=True)
    doc = dict(status.read_doc(REPO / entry["file"]), device=f"NVIDIA {want}")
    out.write_text(json.dumps(doc))
    (run / status.GPU_FILE).write_text(f"NVIDIA {other} 80GB HBM3, 81559 MiB\n")
    refused = []
    assert entry["name"] not in status.take(run, root, refused)
    assert (root / entry["file"]).read_bytes() == before
    assert len(refused) == 1 and other in refused[0] and entry["hardware"] in refused[0]
    (run / status.GPU_FILE).unlink()  # no gpu.txt: the output's own field decides
    out.write_text(json.dumps(dict(doc, device=f"NVIDIA {other} 80GB HBM3")))
    refused = []
    assert entry["name"] not in status.take(run, root, refused) and len(refused) == 1
    out.write_text(json.dumps(dict(doc, device=f"NVIDIA {want}")))
    assert entry["name"] in status.take(run, root, refused)  # the same model is taken
    assert status.gpu_model("one NVIDIA RTX PRO 6000 Blackwell") == "RTX PRO 6000"
    assert status.gpu_model("the project's 2-core build machine, no GPU") is None
