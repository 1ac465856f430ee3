"""The check's report: targets, exit code, the timing table (text) and a shareable markdown file.

Targets follow the project's convention ({name: {value, target, met}}). Only correctness decides
the exit code (1 on any failure or any stage that could not run); the speed targets say how this
GPU compares, they do not fail the check.
"""
from __future__ import annotations

from typing import Dict, List, Optional

QUICK_LIMIT_S = 180.0
SELF_CHECK_LIMIT_S = 1.0
VS_BEST_UPSTREAM = 1.0
VS_BF16 = 2.0
MOE_VS_UPSTREAM = 1.0
CORRECTNESS_STAGES = ("correctness", "moe", "layerwise")
EXIT_OK, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 2


def _target(value, threshold: str, met: bool, **extra) -> Dict:
    return {"value": value, "target": threshold, "met": bool(met), **extra}


def targets(result: Dict) -> Dict:
    st = result.get("stages", {})
    out = {}
    corr = st.get("correctness", {})
    if corr.get("status") in ("pass", "fail"):
        n_bad = sum(not r["ok"] for r in corr.get("results", []))
        out["correctness_all_passed"] = _target(n_bad, "0 failures", n_bad == 0, checks=len(corr.get("results", [])))
        sc = corr.get("self_check") or {}
        if "seconds" in sc:
            out["server_self_check_seconds"] = _target(sc["seconds"], f"< {SELF_CHECK_LIMIT_S:g} s and passed",
                                                       sc["ok"] and sc["seconds"] < SELF_CHECK_LIMIT_S)
    else:
        out["correctness_all_passed"] = _target(None, "0 failures", False, status=corr.get("status", "not run"))
    mo = st.get("moe", {})
    if mo.get("status") in ("pass", "fail"):
        n_bad = sum(not r["ok"] for r in mo.get("results", []))
        out["moe_correctness_all_passed"] = _target(n_bad, "0 failures", n_bad == 0, checks=len(mo.get("results", [])))
        v = (mo.get("summary") or {}).get("x_marlin_geomean")
        out["moe_speedup_vs_upstream_marlin_geomean"] = _target(
            v, f">= {MOE_VS_UPSTREAM:g}", v is not None and v >= MOE_VS_UPSTREAM,
            **({"upstream_choice": mo.get("upstream_choice")} if v is not None else
               {"missing": ((mo.get("backends") or {}).get("marlin") or {}).get("reason") or "Marlin MoE not timed",
                "upstream_choice": mo.get("upstream_choice")}))
    elif mo.get("status") != "skipped":
        out["moe_correctness_all_passed"] = _target(None, "0 failures", False, status=mo.get("status", "not run"))
    lw = st.get("layerwise", {})
    if lw.get("status") in ("pass", "fail"):
        out["layerwise_agrees_with_graphs_disabled"] = _target(
            (lw.get("counts") or {}).get("mismatch"), "mismatches <= 5% of prompts, |delta logprob| <= 1.0",
            lw["status"] == "pass", detail=lw.get("detail"))
    tm = st.get("timing", {})
    summ = tm.get("summary") or {}
    dec = summ.get("decode") or {}
    if tm.get("status") == "pass":
        v = dec.get("best_upstream")
        out["decode_speedup_vs_best_upstream_fp4_geomean"] = _target(
            v, f">= {VS_BEST_UPSTREAM:g}", v is not None and v >= VS_BEST_UPSTREAM,
            **({} if v is not None else {"missing": "no upstream FP4 backend ran on this GPU"}))
        v = dec.get("bf16")
        out["decode_speedup_vs_bf16_geomean"] = _target(v, f">= {VS_BF16:g}", v is not None and v >= VS_BF16)
    if result.get("args", {}).get("quick"):
        el = result.get("elapsed_s")
        out["quick_run_seconds"] = _target(el, f"<= {QUICK_LIMIT_S:g} s", el is not None and el <= QUICK_LIMIT_S)
    return out


def exit_code(result: Dict) -> int:
    if result.get("no_gpu"):
        return EXIT_NO_GPU
    for name, stage in result.get("stages", {}).items():
        if stage.get("status") == "error" or (name in CORRECTNESS_STAGES and stage.get("status") == "fail"):
            return EXIT_FAIL
    return EXIT_OK


def _fmt(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def timing_columns(timing: Dict) -> List[str]:
    """ours, bf16, then the upstream backends that ran, in BACKENDS order."""
    from .upstream_fp4 import names

    seen = {b for r in timing.get("rows", []) for b in r["us"]}
    return [c for c in ["sm120", "bf16", *names()] if c in seen]


def timing_table(timing: Dict, markdown: bool = False) -> List[str]:
    cols = timing_columns(timing)
    head = ["shape", "M"] + [f"{c} us" + ("" if c == "sm120" else f" (x)") for c in cols] + ["sm120 % copy BW"]
    rows = []
    for r in timing.get("rows", []):
        cells = [r["shape"], str(r["M"])]
        for c in cols:
            t = r["us"].get(c)
            cells.append("-" if t is None else (f"{t:.2f}" if c == "sm120" else f"{t:.2f} (x{r['x'].get(c, 0):.2f})"))
        cells.append(_fmt(r["bw_pct"].get("sm120"), 1))
        rows.append(cells)
    return _table(head, rows, markdown)


def moe_table(moe: Dict, markdown: bool = False) -> List[str]:
    """The MoE stage's timing rows: ours, then each backend timed, with x = its time / ours."""
    cols = ["sm120"] + sorted({b for r in moe.get("rows", []) for b in r["us"]} - {"sm120"})
    head = ["MoE shapes", "tokens", "experts hit"] + [f"{c} us" + ("" if c == "sm120" else " (x)") for c in cols] + [
        "sm120 % copy BW"]
    rows = []
    for r in moe.get("rows", []):
        cells = [r["shape"], str(r["tokens"]), f"{r['experts_hit_mean']:.1f}"]
        for c in cols:
            t = r["us"].get(c)
            cells.append("-" if t is None else (f"{t:.2f}" if c == "sm120" else f"{t:.2f} (x{r['x'].get(c, 0):.2f})"))
        cells.append(_fmt(r.get("bw_pct", {}).get("sm120"), 1))
        rows.append(cells)
    return _table(head, rows, markdown)


def _table(head: List[str], rows: List[List[str]], markdown: bool) -> List[str]:
    if markdown:
        return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(c) + " |" for c in rows]
    widths = [max(len(h), *(len(c[i]) for c in rows)) if rows else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return [line(head)] + [line(c) for c in rows]


def failures(result: Dict, limit: int = 20) -> List[str]:
    out = []
    for stage_name in ("correctness", "moe"):
        for r in result.get("stages", {}).get(stage_name, {}).get("results", []):
            if not r["ok"]:
                out.append(f"{r['name']}: {r['detail']}")
    for name, stage in result.get("stages", {}).items():
        if stage.get("status") in ("fail", "error") and name not in ("correctness", "moe"):
            out.append(f"{name}: {stage.get('detail') or stage.get('error')}")
        elif stage.get("status") == "error":
            out.append(f"{name}: {stage.get('error')}")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def markdown(result: Dict) -> str:
    env = result.get("env", {})
    L = ["# sglang-sm120 check report", "",
         f"- GPU: {env.get('gpu')} ({env.get('arch')}, {env.get('sm_count')} SMs, {env.get('memory_gib')} GiB), "
         f"driver {env.get('driver')}, CUDA {env.get('cuda_runtime')}, torch {env.get('torch')}",
         f"- sglang-sm120 {env.get('fork') or '(not a fork build)'} over upstream {env.get('upstream') or '-'} "
         f"({env.get('patches')} patches); "
         f"kernels {', '.join(env.get('kernel_archs') or []) or 'not loadable'}; flashinfer {env.get('flashinfer')}; "
         f"sglang-kernel {env.get('sglang_kernel')}",
         f"- command: `{result.get('command')}`" + (f" at commit `{result['commit']}`" if result.get("commit") else ""),
         f"- date: {result.get('date')}, {result.get('elapsed_s')} s",
         f"- result: **{'PASS' if result.get('exit_code') == 0 else 'FAIL'}** (exit code {result.get('exit_code')})",
         "", "## Targets", "", "| target | value | threshold | met |", "|---|---|---|---|"]
    for k, v in result.get("targets", {}).items():
        L.append(f"| {k} | {v['value']} | {v['target']} | {v['met']}{' (' + v['missing'] + ')' if v.get('missing') else ''} |")
    L += ["", "## Stages", "", "| stage | status | seconds | detail |", "|---|---|---|---|"]
    for name, st in result.get("stages", {}).items():
        L.append(f"| {name} | {st.get('status')} | {st.get('seconds', '-')} | {st.get('detail') or st.get('error') or ''} |")
    bad = failures(result)
    if bad:
        L += ["", "## Failures", ""] + [f"- {b}" for b in bad]
    mo = result.get("stages", {}).get("moe", {})
    if mo.get("rows"):
        L += ["", "## MoE timing", "",
              f"Microseconds per MoE layer call (grouped NVFP4 W4A16 MoE, top-8; median of CUDA-graph replays over "
              f"routings whose expert weights exceed 2.5x L2); (x) = that backend's time / sm120's; % copy BW on the "
              f"weight bytes of the experts a call hits, against {mo.get('copy_bw_tbps')} TB/s measured in this run. "
              f"Upstream's NVFP4 MoE backend on this GPU: {mo.get('upstream_choice')}.", ""]
        L += moe_table(mo, markdown=True)
        L += ["", "MoE backends:", ""]
        for b, info in (mo.get("backends") or {}).items():
            L.append(f"- {b}: {'timed' if info['available'] else 'unavailable: ' + str(info['reason'])}")
    tm = result.get("stages", {}).get("timing", {})
    if tm.get("rows"):
        L += ["", "## Timing", "",
              f"Microseconds per linear-layer call (median of CUDA-graph replays over weight copies larger than L2); "
              f"(x) = that backend's time / sm120's (> 1: sm120 faster); % copy BW against "
              f"{tm.get('copy_bw_tbps')} TB/s measured on this GPU in this run; launch floor "
              f"{tm.get('launch_floor_us')} us. sm120's W4A4 path (M above the W4A16 limit): {tm.get('w4a4')}.", ""]
        L += timing_table(tm, markdown=True)
        L += ["", "Upstream FP4 backends:", ""]
        for b, info in (tm.get("backends") or {}).items():
            L.append(f"- {b}: {'timed' if info['available'] else 'unavailable: ' + str(info['reason'])} ({info['description']})")
    return "\n".join(L) + "\n"


def summary_lines(result: Dict) -> List[str]:
    L = []
    for k, v in result.get("targets", {}).items():
        L.append(f"  {'ok  ' if v['met'] else 'MISS'} {k}: {v['value']} (target {v['target']})")
    for b in failures(result):
        L.append(f"  FAILED {b}")
    return L


def unavailable(result: Dict, stage: str = "timing") -> Optional[Dict]:
    tm = result.get("stages", {}).get(stage, {})
    return {b: i["reason"] for b, i in (tm.get("backends") or {}).items() if not i["available"]} or None
