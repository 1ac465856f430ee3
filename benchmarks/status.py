"""Results of record: the registry (benchmarks/records.toml), the files it names, docs/status.md.

    python benchmarks/status.py --write           # regenerate docs/status.md
    python benchmarks/status.py --check           # exit 1 if docs/status.md or a record is off
    python benchmarks/status.py --take RESULTS    # copy a run's outputs to their record paths, then --write

`--take` refuses an output measured on another GPU model than its record's `hardware` names (an
H100 run does not replace an H200 record under the H200's name): the GPU is RESULTS/gpu.txt, which
benchmarks/gpu_queue.sh writes from nvidia-smi, else the device the output itself records. To keep
such a run as the record, change the record's `hardware` (and names) in the registry first.

The registry is the only list of results of record: the status page, `--take` and the CPU tests
(test/cpu/benchmarks/test_results_files.py) all read it. Standard library only (runs without the fork).
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REGISTRY = "benchmarks/records.toml"
RESULTS = "benchmarks/results"
STATUS = "docs/status.md"
REQUIRED = ("name", "measures", "command", "file", "headline", "hardware", "base")
# GPU models a record's hardware or a run's device is told apart by (whole words: "H200" does not
# match inside "GH200")
GPU_MODELS = re.compile(r"\b(RTX PRO 6000|RTX 5090|GH200|H100|H200|B200|B300|A100|L40S)\b")
GPU_FILE = "gpu.txt"


def registry(repo: Path = REPO) -> list[dict]:
    return tomllib.loads((repo / REGISTRY).read_text())["record"]


def read_doc(path: Path) -> dict:
    """A results JSON, plain or gzip-compressed (.json.gz)."""
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def _store(src: Path, dst: Path) -> None:
    """Copy src to dst, compressing when dst ends in .gz (no name or time in the header, so the
    same input gives the same bytes)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.name.endswith(".gz"):
        dst.write_bytes(gzip.compress(src.read_bytes(), 9, mtime=0))
    else:
        shutil.copyfile(src, dst)


def commit_of(entry: dict, doc: dict) -> str | None:
    c = doc.get("commit") or (doc.get("meta") or {}).get("commit") or entry.get("commit")
    return str(c)[:7] if c else None


def named_paths(entry: dict) -> list[str]:
    return [entry[k] for k in ("file", "md", "log") if entry.get(k)]


def problems(repo: Path = REPO) -> list[str]:
    """Everything that keeps the registry and benchmarks/results/ from agreeing: a benchmark with
    two records, a file nobody names, a named file missing, a record without targets."""
    out = []
    entries = registry(repo)
    names = [e.get("name") for e in entries]
    out += [f"benchmark {n} has {names.count(n)} records" for n in sorted(set(names)) if names.count(n) > 1]
    files = [e.get("file") for e in entries]
    out += [f"{f} is the record of {files.count(f)} benchmarks" for f in sorted(set(files)) if files.count(f) > 1]
    named = set()
    for e in entries:
        missing = [k for k in REQUIRED if not e.get(k)]
        if missing:
            out.append(f"{e.get('name')}: registry entry lacks {', '.join(missing)}")
            continue
        named.update(named_paths(e))
        for p in named_paths(e):
            if not (repo / p).is_file():
                out.append(f"{e['name']}: {p} does not exist")
        if not (repo / e["file"]).is_file():
            continue
        doc = read_doc(repo / e["file"])
        targets = doc.get("targets") if isinstance(doc, dict) else None
        if not isinstance(targets, dict) or not targets:
            out.append(f"{e['file']}: no non-empty top-level targets object")
            continue
        for k, t in targets.items():
            if not (isinstance(t, dict) and {"value", "target", "met"} <= set(t)):
                out.append(f"{e['file']}: target {k} lacks value/target/met")
        out += [f"{e['name']}: headline {h} is not a target of {e['file']}" for h in e["headline"]
                if h not in targets]
        if not commit_of(e, doc):
            out.append(f"{e['name']}: no commit in the file or the registry")
    for f in sorted((repo / RESULTS).rglob("*")):
        rel = f.relative_to(repo).as_posix()
        if f.is_file() and rel not in named:
            out.append(f"{rel} is not named in {REGISTRY}")
    return out


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):  # shown rounded; the file keeps every digit
        return str(round(v, 1 if abs(v) >= 100 else 4))
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "))
    return str(v)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(repo: Path = REPO) -> str:
    entries = registry(repo)
    lines = [
        "# Status: results of record",
        "",
        f"Generated by `python benchmarks/status.py --write` from `{REGISTRY}` and the files it names;",
        "do not edit by hand (`test/cpu/benchmarks/test_results_files.py` fails when this page is stale).",
        "One row per benchmark: its headline targets (value, then target), how many of all its",
        "targets were met, where and on which upstream base it ran, the commit measured and the file.",
        "What each measures and every target are in its section below the table. No SM120 GPU has run this code;",
        "base 0.5.23 has run only the CPU suite. Earlier and superseded runs:",
        "[history.md](history.md#old-records).",
        "",
        "| benchmark | value vs target | met | hardware | base | commit | file |",
        "|---|---|---|---|---|---|---|",
    ]
    details = []
    for e in entries:
        doc = read_doc(repo / e["file"])
        targets = doc["targets"]
        met = sum(1 for t in targets.values() if t["met"])
        head = "; ".join(f"{h}: {_fmt(targets[h]['value'])} ({_fmt(targets[h]['target'])})"
                         for h in e["headline"])
        verdict = f"{'yes' if met == len(targets) else 'no'} ({met}/{len(targets)})"
        shown = e.get("md") or e["file"]
        link = f"[{Path(shown).name}](../{shown})"
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"[{e['name']}](#{e['name'].lower()})", head, verdict, e["hardware"],
            e["base"], commit_of(e, doc), link)) + " |")
        details += ["", f"## {e['name']}", "", e["measures"] + ".", "",
                    f"- produced by: `{e['command']}`",
                    f"- files: " + ", ".join(f"[{Path(p).name}](../{p})" for p in named_paths(e))]
        if e.get("note"):
            details.append(f"- note: {e['note']}")
        details += ["", "| target | value | goal | met |", "|---|---|---|---|"]
        for k, t in targets.items():
            extra = t.get("detail") or t.get("note") or ""
            details.append("| " + " | ".join(_cell(c) for c in (
                k, _fmt(t["value"]), _fmt(t["target"]) + (f" ({extra})" if extra else ""),
                "yes" if t["met"] else "**no**")) + " |")
    return "\n".join(lines + details) + "\n"


def gpu_model(text: str | None) -> str | None:
    m = GPU_MODELS.search(text or "")
    return m.group(1) if m else None


def _device_strings(doc) -> list[str]:
    """Values of `device` / `gpu` keys in a results document, shallowest first (3 levels; lists:
    their first item)."""
    found, level = [], [doc]
    for _ in range(4):
        nxt = []
        for d in level:
            items = d.items() if isinstance(d, dict) else enumerate(d[:1]) if isinstance(d, list) else ()
            for k, v in items:
                if isinstance(v, str) and k in ("device", "gpu"):
                    found.append(v)
                elif isinstance(v, (dict, list)):
                    nxt.append(v)
        level = nxt
    return found


def run_gpu(results: Path, src: Path) -> str | None:
    """The GPU model a run measured on: RESULTS/gpu.txt, else the output's own device field."""
    gpu = results / GPU_FILE
    if gpu.is_file():
        return gpu_model(gpu.read_text())
    try:
        doc = read_doc(src)
    except (OSError, ValueError):
        return None
    return next((m for m in map(gpu_model, _device_strings(doc)) if m), None)


def take(results: Path, repo: Path = REPO, refused: list[str] | None = None) -> list[str]:
    """Copy each record's output (and its report and log) from a run's results folder to the
    record paths; returns the names taken. An output from another GPU model than the record's
    hardware is left, with a line saying why appended to `refused`."""
    taken = []
    for e in registry(repo):
        src = results / e["output"] if e.get("output") else None
        if src is None or not src.is_file():
            continue
        want, got = gpu_model(e["hardware"]), run_gpu(results, src)
        if want and got and want != got:
            if refused is not None:
                refused.append(f"{e['name']}: {src} was measured on an {got}, the record is '{e['hardware']}'; "
                               f"not taken (to keep it, change the record's hardware and names in {REGISTRY})")
            continue
        _store(src, repo / e["file"])
        if e.get("md") and src.with_suffix(".md").is_file():
            _store(src.with_suffix(".md"), repo / e["md"])
        if e.get("log") and e.get("output_log") and (results / e["output_log"]).is_file():
            _store(results / e["output_log"], repo / e["log"])
        taken.append(e["name"])
    return taken


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help=f"regenerate {STATUS}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if {STATUS} is stale or a record is off")
    g.add_argument("--take", type=Path, metavar="RESULTS", help="take a run's outputs as the new records")
    a = ap.parse_args(argv)
    refused: list[str] = []
    if a.take:
        print("took: " + (", ".join(take(a.take, refused=refused)) or "nothing"))
        for line in refused:
            print("refused: " + line, file=sys.stderr)
    bad = problems()
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    page = render()
    if a.check:
        stale = (REPO / STATUS).read_text() != page if (REPO / STATUS).is_file() else True
        if stale:
            print(f"{STATUS} is stale: python benchmarks/status.py --write", file=sys.stderr)
        return int(stale)
    (REPO / STATUS).write_text(page)
    print(f"wrote {STATUS}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
