"""python -m sglang.sm120 check [--quick] [--json FILE] [--shapes glm5|qwen3|all] [--tp N]

Proves the fork correct and measures it on this GPU (docs/sm120-check.md). Stages, each with a
progress line: env, correctness, moe, layerwise, timing. Exit code: 0 all correctness checks passed,
1 a correctness failure or a stage that could not run, 2 no CUDA GPU (or bad arguments).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from sglang.sm120 import settings

from . import report

STAGES = ("env", "correctness", "moe", "layerwise", "timing")
FAMILIES = {"glm5": ("glm5",), "qwen3": ("qwen3",), "all": ("glm5", "qwen3")}
TPS = (1, 2, 4, 8)
DEFAULT_TPS = (1, 4, 8)
# A guard against a hung engine, not a speed target (quick_run_seconds is that): both engines' start-up
# included, and a first run on a machine compiles its JIT kernels (minutes on a fresh host).
LAYERWISE_TIMEOUT_QUICK, LAYERWISE_TIMEOUT = 900.0, 1800.0


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sglang.sm120 check",
        description="Validate sglang-sm120 on this GPU: NVFP4 kernels against the reference, layerwise CUDA "
                    "graphs against graphs disabled on a tiny model, and the speed of the fork's FP4 backend "
                    "beside upstream's and bf16. Exit 0 when every correctness check passes.")
    ap.add_argument("--quick", action="store_true",
                    help="fewer shapes, sizes and prompts (a few minutes at most); the full run takes longer")
    ap.add_argument("--json", type=Path, metavar="FILE",
                    help="write the report as JSON to FILE, and as markdown beside it (FILE with .md)")
    ap.add_argument("--shapes", default="all", choices=sorted(FAMILIES),
                    help="linear-layer and MoE shapes of which model: glm5 (GLM-5), qwen3 (Qwen3-30B-A3B) or all")
    ap.add_argument("--tp", type=int, choices=TPS,
                    help="tensor-parallel size whose per-GPU shapes to use (default: 1, 4 and 8)")
    ap.add_argument("--skip", action="append", default=[], choices=[s for s in STAGES if s != "env"],
                    help="skip a stage (repeatable)")
    ap.add_argument("--tiny-dir", type=Path,
                    help="where the tiny model of the layerwise stage is cached (default ~/.cache/sglang-sm120/tiny)")
    ap.add_argument("--layerwise-timeout", type=float, default=None,
                    help="seconds for the whole layerwise stage (default 900 with --quick, 1800 without)")
    return ap.parse_args(argv)


def select_shapes(family: str, tp: Optional[int], quick: bool) -> List[Tuple[str, int, int]]:
    """(name, N, K) of the chosen model family at the chosen TP (distinct N x K); with quick, the
    smallest and the largest weight of each family."""
    from sglang.sm120.model_shapes import projection_shapes

    seen, sel = set(), []
    for name, n, k in projection_shapes((tp,) if tp else DEFAULT_TPS):
        if name.split()[0].split("-")[0] in FAMILIES[family] and (n, k) not in seen:
            seen.add((n, k))
            sel.append((name, n, k))
    if quick:
        keep = []
        for fam in FAMILIES[family]:
            mine = sorted((s for s in sel if s[0].startswith(fam)), key=lambda s: s[1] * s[2])
            keep += [s for s in (mine[:1] + mine[-1:]) if s not in keep]
        sel = keep
    return sel


class Progress:
    """Timestamped progress lines on stdout, kept for the report."""

    def __init__(self, stream=None):
        self.t0 = time.time()
        self.lines: List[str] = []
        self.stream = stream or sys.stdout

    def __call__(self, msg: str) -> None:
        line = f"[check {time.time() - self.t0:6.1f}s] {msg}"
        self.lines.append(line)
        print(line, file=self.stream, flush=True)


def gpu_probe() -> Tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, ""


# ----------------------------------------------------------------------------- stages

def stage_env(ctx) -> Dict:
    from . import envinfo

    env = envinfo.collect()
    ctx.result["env"] = env
    ctx.log("  " + envinfo.describe(env))
    if env.get("kernel_archs") is None:
        return {"status": "error", "error": f"sm120 kernel library not loadable: {env.get('kernel_error')}"}
    return {"status": "pass", "detail": envinfo.describe(env)}


def stage_correctness(ctx) -> Dict:
    from sglang.sm120.fp4_selfcheck import fault_site

    from . import correctness as C

    fault = fault_site() == "gemm"
    name, n, k = ctx.shapes[0]
    quant = C.run_quantize(ctx.log)
    # timed after the quantize stage and cuBLAS's start (CUDA context up, elementwise kernels
    # loaded): a server pays those once at its first forward whether or not it self-checks
    C.start_cublas()
    sc = C.run_selfcheck(n, k, ctx.log)
    results = [sc] + quant + C.run_gemms(ctx.shapes, C.GEMM_MS, ctx.log, fault=fault)
    bad = [r for r in results if not r["ok"]]
    return {"status": "fail" if bad else "pass", "results": results, "self_check": sc,
            "detail": f"{len(results) - len(bad)}/{len(results)} checks passed"
                      + (f"; first failure: {bad[0]['name']}: {bad[0]['detail']}" if bad else "")}


def stage_moe(ctx) -> Dict:
    from . import moe_check

    return moe_check.run(ctx.args.shapes, ctx.args.quick, 7 if ctx.args.quick else 15, ctx.log)


def stage_layerwise(ctx) -> Dict:
    from . import layerwise as LW

    import torch

    a = ctx.args
    torch.cuda.empty_cache()  # the engines are other processes: leave them the memory this one cached
    limit = a.layerwise_timeout or (LAYERWISE_TIMEOUT_QUICK if a.quick else LAYERWISE_TIMEOUT)
    with tempfile.TemporaryDirectory(prefix="sm120-check-") as work:
        res = LW.run(Path(work), a.tiny_dir, a.quick, limit, ctx.log)
    res["status"] = "pass" if res.pop("ok") else "fail"
    return res


def stage_timing(ctx) -> Dict:
    from . import timing as TM

    ms = (TM.QUICK_DECODE_MS + TM.QUICK_PREFILL_MS) if ctx.args.quick else (TM.DECODE_MS + TM.PREFILL_MS)
    res = TM.run(ctx.shapes, ms, 7 if ctx.args.quick else 15, ctx.log)
    res["status"] = "pass"
    dec = res["summary"]["decode"]
    res["detail"] = (f"decode geomean: x{dec.get('best_upstream')} vs the best upstream FP4 backend, "
                     f"x{dec.get('bf16')} vs bf16")
    return res


DEFAULT_STAGES: Dict[str, Callable] = {"env": stage_env, "correctness": stage_correctness, "moe": stage_moe,
                                       "layerwise": stage_layerwise, "timing": stage_timing}


# ----------------------------------------------------------------------------- main

def write_reports(path: Path, result: Dict) -> Tuple[Path, Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    md = path.with_suffix(".md")
    md.write_text(report.markdown(result))
    return path, md


def main(argv: Optional[Sequence[str]] = None, *, stages: Optional[Dict[str, Callable]] = None,
         probe: Callable[[], Tuple[bool, str]] = gpu_probe, stream=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    out = stream or sys.stdout
    log = Progress(out)
    result: Dict = {"command": "python -m sglang.sm120 check " + " ".join(argv), "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "stages": {},
        "commit": settings.text("SGLANG_SM120_COMMIT")}  # where the build carries no git metadata
    ok, why = probe()
    if not ok:
        print(f"error: no CUDA GPU: {why}; the check runs on the GPU it validates", file=sys.stderr)
        result.update(no_gpu=True, error=why, exit_code=report.EXIT_NO_GPU)
        if a.json:
            write_reports(a.json, result)
        return report.EXIT_NO_GPU
    from sglang.sm120.fp4_selfcheck import FAULT_INJECT_ENV, fault_site

    try:
        fault = fault_site()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return report.EXIT_NO_GPU
    if fault:
        result["fault_injected"] = fault
        what = "GEMM" if fault == "gemm" else "MoE"
        log(f"FAULT INJECTION ON ({FAULT_INJECT_ENV}={fault}): one {what} result is corrupted on purpose")
    runners = {**DEFAULT_STAGES, **(stages or {})}
    order = [s for s in STAGES if s not in a.skip]
    ctx = SimpleNamespace(args=a, log=log, result=result, shapes=select_shapes(a.shapes, a.tp, a.quick))
    log(f"shapes: {', '.join(f'{n} ({N}x{K})' for n, N, K in ctx.shapes)}")
    for i, name in enumerate(order, 1):
        log(f"stage {i}/{len(order)}: {name}")
        t = time.time()
        try:
            st = runners[name](ctx)
        except Exception as exc:
            st = {"status": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                  "traceback": traceback.format_exc()}
        st["seconds"] = round(time.time() - t, 1)
        result["stages"][name] = st
        log(f"stage {i}/{len(order)}: {name} {st['status'].upper()} in {st['seconds']} s"
            + (f": {st.get('detail') or st.get('error')}" if st.get("detail") or st.get("error") else ""))
        if name == "env" and st["status"] == "error":
            break  # without the kernel library nothing else can run
    for name in a.skip:
        result["stages"][name] = {"status": "skipped"}
    result["elapsed_s"] = round(time.time() - log.t0, 1)
    result["targets"] = report.targets(result)
    result["exit_code"] = code = report.exit_code(result)
    result["log"] = log.lines
    mo = result["stages"].get("moe", {})
    if mo.get("rows"):
        print("", file=out)
        for line in report.moe_table(mo):
            print(line, file=out)
        for b, why in (report.unavailable(result, "moe") or {}).items():
            print(f"  MoE {b}: unavailable: {why}", file=out)
    tm = result["stages"].get("timing", {})
    if tm.get("rows"):
        print("", file=out)
        for line in report.timing_table(tm):
            print(line, file=out)
        print(f"  sm120 W4A4 path: {tm.get('w4a4')}", file=out)
        for b, why in (report.unavailable(result) or {}).items():
            print(f"  {b}: unavailable: {why}", file=out)
    print("", file=out)
    for line in report.summary_lines(result):
        print(line, file=out)
    print(f"RESULT: {'PASS' if code == 0 else 'FAIL'} (exit {code}) in {result['elapsed_s']} s", file=out)
    if a.json:
        j, m = write_reports(a.json, result)
        print(f"report: {j} and {m}", file=out)
    return code
