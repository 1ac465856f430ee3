"""python -m sglang.sm120 plan --model-path M --gpu G [--json] [server flags...]

What upstream alone and the fork would capture on card G (no GPU needed): both resolved by
upstream's own server-argument resolution with the card's facts faked (plan.cards), side by side.
Server flags (--tp-size, --ep-size, --max-running-requests, ...) pass through to upstream's parser.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import List, Optional

from . import cards, graph_memory, models, resolve

LAYERWISE = "layerwise"


def _sizes(resolved: resolve.Resolved):
    """(full-graph decode sizes, layerwise decode sizes) the server captures."""
    dec = resolved.decode
    if dec["backend"] == LAYERWISE:
        top = dec["layerwise_full_max_bs"] or 0
        return [s for s in dec["bs"] if s <= top], [s for s in dec["bs"] if s > top]
    if dec["backend"] == "disabled":
        return [], []
    return resolve.captured_decode_sizes(resolved), []


def _upstream_rule(resolved, argv, card) -> str:
    if any(a.split("=")[0] in ("--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode", "--cuda-graph-max-bs",
                               "--cuda-graph-bs", "--cuda-graph-config") for a in argv):
        return "the operator's decode sizes (--cuda-graph-max-bs-decode / --cuda-graph-bs-decode / JSON)"
    full, _ = _sizes(resolved)
    if resolved.max_running_requests and full and max(full) == resolved.max_running_requests:
        return f"upstream's memory default, lowered to --max-running-requests ({resolved.max_running_requests})"
    return (f"upstream's memory default for a {card.memory_mib / 1024:.0f} GiB card at TP {resolved.tp_size} "
            "(handle_gpu_memory_settings)")


def _fork_rule(resolved) -> Optional[str]:
    prefix = "layerwise decode full-graph ceiling: "
    return next((m[len(prefix):] for m in resolved.log if m.startswith(prefix)), None)


def _column(resolved, argv, card, config, fp4, fork: bool) -> dict:
    full, layerwise = _sizes(resolved)
    kind = {"layerwise": "layerwise", "breakable": "breakable", "full": "full"}.get(resolved.prefill["backend"])
    pre_sizes = list(resolved.prefill["bs"] or []) if kind else []
    largest = max(full + layerwise) if full or layerwise else 0
    return {
        "decode_backend": resolved.decode["backend"],
        "full_graph_ceiling": max(full) if full else 0,
        "ceiling_rule": (_fork_rule(resolved) if fork and layerwise else None) or _upstream_rule(resolved, argv, card),
        "decode_full_sizes": full, "decode_layerwise_sizes": layerwise, "largest_decode_batch": largest,
        "prefill_backend": resolved.prefill["backend"], "prefill_buckets": pre_sizes,
        "prefill_request_slots": resolved.prefill.get("full_prefill_max_req") if kind == "layerwise" else None,
        "attention": resolved.attention, "fp4_gemm_backend": fp4,
        "moe_runner_backend": resolved.moe_runner_backend,
        "chunked_prefill_size": resolved.chunked_prefill_size,
        "max_running_requests": resolved.max_running_requests,
        "mem_fraction_static": resolved.mem_fraction_static,
        "graph_memory_gb_estimate": {
            "decode": _round(graph_memory.estimate_gb("decode", {"full": full, "layerwise": layerwise}, config)),
            "prefill": _round(graph_memory.estimate_gb("prefill", {kind: pre_sizes} if kind else {}, config)),
        },
        "fallbacks": [m for m in resolved.log if "do not support" in m],
    }


def _round(x):
    return None if x is None else round(x, 3)


def _fp4(card, argv) -> tuple:
    """(upstream's FP4 GEMM backend, the fork's) for the requested --fp4-gemm-backend."""
    from sglang.sm120 import fp4_backend

    requested = _flag_value(argv, "--fp4-gemm-backend", "auto")
    with cards.faked_card(card):
        upstream = fp4_backend.upstream_resolution("auto" if requested == "sm120" else requested)
    if requested == "sm120" or (requested == "auto" and fp4_backend.picks_sm120(card.capability)):
        return upstream, "sm120 (fork kernels, once they load and pass their self-check on the GPU)"
    return upstream, upstream


def _moe(card, argv, ours) -> Optional[str]:
    """The fork's MoE runner backend where it differs from what resolving on this CPU shows: the
    sm120 kernel for ModelOpt NVFP4 experts under `--moe-runner-backend sm120`, or `auto` on an SM120
    card (the server decides once the library loads on the GPU and the self-check passes); else
    None (the resolved value stands)."""
    from sglang.sm120 import fp4_backend

    requested = _flag_value(argv, "--moe-runner-backend", "auto")
    if ours.quantization != "modelopt_fp4":
        return None
    if requested == "sm120" or (requested == "auto" and fp4_backend.picks_sm120(card.capability)):
        return "sm120 (fork kernel, once it loads and passes its self-check on the GPU)"
    return None


def _eager_moe(column: dict, base: str, quantization: Optional[str] = None) -> str:
    """What runs the MoE between layerwise decode segments (runner/lean_moe.py), from the flags and
    the checkpoint's quantization: the server decides per layer (its log names each refusal)."""
    from sglang.sm120.runner import lean_moe

    if not column["decode_layerwise_sizes"]:
        return "-"
    moe = str(column["moe_runner_backend"])
    if not lean_moe.lean_moe_requested():
        return "upstream's MoE path (SGLANG_SM120_LEAN_MOE=0)"
    if moe.startswith("sm120"):
        return "lean step: the sm120 kernel call"
    if moe not in ("auto", "triton"):
        return f"upstream's MoE path ({moe})"
    if quantization:
        return f"upstream's MoE path ({quantization} experts; the lean step takes bf16/fp16 ones)"
    if base not in lean_moe.LEAN_STEP_BASES:
        return f"upstream's MoE path (the lean step is not ported to {base})"
    return "lean step: upstream's Triton launches (bf16 experts)"


def _eager_attention(column: dict, config: dict) -> str:
    """What runs decode attention at layerwise sizes (runner/decode_attention.py)."""
    from sglang.sm120.runner import decode_attention

    if not column["decode_layerwise_sizes"]:
        return "-"
    attention = column["attention"]
    backend = attention.get("decode_attention_backend") or attention.get("attention_backend")
    return decode_attention.planned(str(backend), mla="kv_lora_rank" in config)


def _flag_value(argv, name: str, default: str) -> str:
    return next((a.split("=", 1)[1] if "=" in a else argv[i + 1]
                 for i, a in enumerate(argv) if a.split("=")[0] == name and ("=" in a or i + 1 < len(argv))),
                default)


def build_plan(model_path: str, gpu: str, argv: List[str]) -> dict:
    from sglang.sm120 import upstream_api

    card = cards.local_card() if gpu == "auto" else cards.card(gpu)
    folder = models.model_dir(model_path)
    with open(f"{folder}/config.json") as f:
        config = json.load(f)
    up_argv, dropped = resolve.upstream_argv(argv)
    upstream, ours = resolve.resolve(folder, card, up_argv), resolve.resolve(folder, card, argv)
    fp4_up, fp4_ours = _fp4(card, argv)
    fork = _column(ours, argv, card, config, fp4_ours, fork=True)
    fork["moe_runner_backend"] = _moe(card, argv, ours) or fork["moe_runner_backend"]
    fork["eager_moe"] = _eager_moe(fork, upstream_api.installed_base(), ours.quantization)
    fork["decode_attention_layerwise"] = _eager_attention(fork, config)
    up = dict(_column(upstream, up_argv, card, config, fp4_up, fork=False), eager_moe="-",
              decode_attention_layerwise="-")
    plan = {
        "base": upstream_api.installed_base(), "model": model_path, "card": dataclasses.asdict(card),
        "argv": argv, "upstream_alone_leaves_out": dropped,
        "upstream": up, "fork": fork,
        "graph_memory_model": _memory_model(),
    }
    plan["warnings"] = _warnings(plan)
    return plan


def _memory_model() -> dict:
    fitted = graph_memory.load()
    errs = graph_memory.errors(fitted)
    return {"label": "estimate", "fitted_on": fitted["fitted_on"],
            "largest_error_on_fit_runs": max(abs(e["error"]) for e in errs), "runs": len(errs),
            "scaled_by": "layers x hidden size of this model (the per-layer activation part only)"}


def _warnings(plan: dict) -> List[str]:
    out = []
    for who in ("upstream", "fork"):
        col = plan[who]
        running = col["max_running_requests"]
        if running and col["largest_decode_batch"] < running:
            out.append(f"{who}: the largest captured decode batch ({col['largest_decode_batch']}) is below "
                       f"--max-running-requests ({running}): larger batches decode eagerly")
    return out


def _fmt_sizes(sizes: List[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]} ({len(sizes)})" if sizes else "-"


def render(plan: dict) -> str:
    c = plan["card"]
    lines = [f"plan: {plan['model']} on {c['name']} ({c['memory_mib'] / 1024:.0f} GiB, sm_{c['capability'][0]}"
             f"{c['capability'][1]}, {c['sms']} SMs), base {plan['base']}",
             f"flags: {' '.join(plan['argv']) or '(none)'}"]
    if plan["upstream_alone_leaves_out"]:
        lines.append("upstream alone refuses or lacks: " + ", ".join(plan["upstream_alone_leaves_out"]))
    rows = [
        ("decode backend", lambda x: x["decode_backend"]),
        ("full-graph ceiling", lambda x: str(x["full_graph_ceiling"])),
        ("decode full graphs", lambda x: _fmt_sizes(x["decode_full_sizes"])),
        ("decode layerwise", lambda x: _fmt_sizes(x["decode_layerwise_sizes"])),
        ("largest decode batch", lambda x: str(x["largest_decode_batch"])),
        ("prefill backend", lambda x: x["prefill_backend"]),
        ("prefill buckets", lambda x: _fmt_sizes(x["prefill_buckets"])),
        ("attention (prefill/decode)", lambda x: "/".join(str(x["attention"][k] or x["attention"]["attention_backend"])
                                                          for k in ("prefill_attention_backend", "decode_attention_backend"))),
        ("FP4 GEMM backend", lambda x: x["fp4_gemm_backend"]),
        ("MoE runner backend", lambda x: str(x["moe_runner_backend"])),
        ("MoE between segments", lambda x: x["eager_moe"]),
        ("decode attention, layerwise", lambda x: x["decode_attention_layerwise"]),
        ("chunked prefill size", lambda x: str(x["chunked_prefill_size"])),
        ("mem fraction static", lambda x: str(x["mem_fraction_static"])),
        ("graph memory, decode (est.)", lambda x: _gb(x["graph_memory_gb_estimate"]["decode"])),
        ("graph memory, prefill (est.)", lambda x: _gb(x["graph_memory_gb_estimate"]["prefill"])),
    ]
    w = max(len(r[0]) for r in rows) + 2
    lines.append(f"{'':<{w}}{'upstream alone':<34}sglang-sm120")
    for name, get in rows:
        lines.append(f"{name:<{w}}{get(plan['upstream']):<34}{get(plan['fork'])}")
    for who in ("upstream", "fork"):
        lines.append(f"ceiling rule ({who}): {plan[who]['ceiling_rule']}")
    for m in plan["fork"]["fallbacks"]:
        lines.append(f"fork fallback: {m}")
    mm = plan["graph_memory_model"]
    lines.append(f"graph memory is an ESTIMATE: per-size model fitted on {mm['fitted_on']}; largest error on "
                 f"its {mm['runs']} fit runs {mm['largest_error_on_fit_runs']:.1%}; other models scaled by "
                 f"{mm['scaled_by']}")
    lines += [f"WARNING: {w}" for w in plan["warnings"]]
    return "\n".join(lines)


def _gb(x) -> str:
    return "not measured for this backend" if x is None else f"{x:.2f} GB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120 plan", description=__doc__.splitlines()[0],
                                 epilog="Other arguments are server flags, passed to upstream's parser.")
    ap.add_argument("--model-path", required=True,
                    help=f"a folder with config.json, or a built-in model: {', '.join(models.KNOWN)}")
    ap.add_argument("--gpu", required=True, help=f"{'|'.join(cards.CARDS)}|auto (auto: this machine's GPU 0)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args, server_argv = ap.parse_known_args(argv)
    try:
        plan = build_plan(args.model_path, args.gpu, server_argv)
    except (ValueError, RuntimeError) as e:
        print(f"plan: {e}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=1) if args.json else render(plan))
    return 0
