"""Which source makes layerwise's greedy tokens differ from graphs disabled? (issue 43, a probe)

Starts one server per variant side by side on the one GPU (KV pools capped), sends each the same
deterministic greedy workload (one batched /generate per batch: batches of 1 to 1000 requests,
prompts of 1 to 1500 tokens, 16 new tokens; one batch sent twice, so its second send is served
from the radix cache), and reports per variant the share of sequences whose tokens equal the
reference's (`off-a`, graphs disabled), split by where they first differ (token 0: prefill; later:
decode), by prompt-length band and by batch. Each variant switches ONE source between the
layerwise and the upstream path (list: --list). `off-b` against `off-a` is the noise floor.

    PYTHONPATH=/tmp/site python3 lab/same_tokens_probe.py --out $OUT/same-tokens-probe \\
        --models-dir /tmp/sm120-tiny [--model glm4_moe-bf16] [--variants off-a,off-b,seed ...]

Writes OUT/same-tokens-probe.json (+ .md, and one server log per variant there). A probe, not a
result of record: test/gpu/test_same_tokens.py holds the claims.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]

NEW_TOKENS = 16
BANDS = ((1, 8), (9, 64), (65, 256), (257, 700), (701, 1500))  # prompt lengths, tokens
BATCH_SIZES = (1, 5, 17, 33, 64, 200, 300, 520, 1000)
REPEAT_OF = 64  # this batch is sent again afterwards: its prompts are then radix-cache hits
REFERENCE, NOISE = "off-a", "off-b"

_LAYERWISE = ["--enable-piecewise-cuda-graph"]  # the seed's flags: layerwise for both phases
# name -> (what it switches, extra flags, extra environment)
VARIANTS: Dict[str, tuple] = {
    "off-a": ("graphs disabled (the reference)", ["--disable-cuda-graph"], {}),
    "off-b": ("graphs disabled again (noise floor)", ["--disable-cuda-graph"], {}),
    "upstream": ("upstream's default: full decode graphs, breakable prefill", [], {}),
    "seed": ("layerwise both phases, every default (the seed's flags)", _LAYERWISE, {}),
    "lw-decode": ("layerwise decode only (prefill upstream's breakable)",
                  ["--cuda-graph-backend-decode", "layerwise"], {}),
    "lw-prefill": ("layerwise prefill only (decode upstream's full graphs)",
                   ["--cuda-graph-backend-prefill", "layerwise"], {}),
    "lw-upstream-moe": ("seed, eager MoE through upstream's forward, not the lean step", _LAYERWISE,
                        {"SGLANG_SM120_LEAN_MOE": "0"}),
    "lw-padded-moe": ("seed, eager MoE on every row of the captured size, not the real rows",
                      _LAYERWISE, {"SGLANG_SM120_LAYERWISE_MOE_ROWS": "padded"}),
    "lw-every-size": ("seed, every decode size layerwise (the eager MoE at 1..1024)",
                      _LAYERWISE + ["--cuda-graph-layerwise-every-size"], {}),
    "lw-captured-auto": ("seed, prefill attention captured (FlashInfer auto: FA3 on SM90)", _LAYERWISE,
                         {"SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "auto"}),
    "lw-captured-fa2": ("seed, prefill attention captured on FA2", _LAYERWISE,
                        {"SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "fa2"}),
    "lw-plain-helpers": ("seed, Dynamo-free helpers' plain bodies instead of their eager twins",
                         _LAYERWISE, {"SGLANG_SM120_LAB_VARIANT": "plain-eager-helpers"}),
    "lw-compiled-helpers": ("seed, upstream's torch.compile'd helpers (Dynamo on, traps off)",
                            _LAYERWISE, {"SGLANG_SM120_LAB_VARIANT": "compiled-helpers"}),
    # padding: FlashInfer's decode plan sizes its KV chunks from every row's page count, a padded
    # row's included, so a padded size may split a long request's KV where eager does not
    "lw-captured-decode-attention": ("seed, decode attention inside the graphs at the padded batch's plan "
                                     "(the default before session 15: no eager attention step)",
                                     _LAYERWISE, {"SGLANG_SM120_LAYERWISE_DECODE_ATTENTION": "captured"}),
    "upstream-1024": ("upstream's full decode graphs up to 1024 (padded sizes above 256 too)",
                      ["--cuda-graph-max-bs-decode", "1024"], {}),
    "upstream-exact": ("upstream's full decode graphs at exactly the probe's batch sizes (no padding)",
                       ["--cuda-graph-bs-decode", *map(str, BATCH_SIZES)], {}),
    "lw-exact": ("seed, decode sizes exactly the probe's batch sizes (no padding; layerwise above 256)",
                 _LAYERWISE + ["--cuda-graph-bs-decode", *map(str, BATCH_SIZES)], {}),
    "lw-exact-compiled": ("lw-exact with upstream's torch.compile'd helpers (Dynamo on, traps off)",
                          _LAYERWISE + ["--cuda-graph-bs-decode", *map(str, BATCH_SIZES)],
                          {"SGLANG_SM120_LAB_VARIANT": "compiled-helpers"}),
}
# candidates for the compiled sigmoid router's numerics (lab variants router-ORDER[-divfull]:
# runner/gpu_numerics.py), run only when named: test/gpu/test_dynamo_free_bits_gpu.py says which
# give the compiled bits (moe_sum_reduce's twin gives them at top-k 2..9: sessions 13, 15)
ORDERS = ("sequential", "tree", "butterfly", "pairs-butterfly", "quads-butterfly")  # gpu_numerics.ORDERS
NAMED_ONLY = {f"lw-exact-router-{o}{d}": (f"lw-exact with the sigmoid router under Inductor's GPU numerics, "
                                          f"sums {o}-wise{', a division by a number as Triton divides' if d else ''}",
                                          _LAYERWISE + ["--cuda-graph-bs-decode", *map(str, BATCH_SIZES)],
                                          {"SGLANG_SM120_LAB_VARIANT": f"router-{o}{d}"})
              for o in ORDERS for d in ("", "-divfull")}
VARIANTS.update(NAMED_ONLY)


def common_flags(max_total_tokens: int) -> List[str]:
    return ["--attention-backend", "flashinfer", "--max-running-requests", "1024",
            "--chunked-prefill-size", "8192", "--max-total-tokens", str(max_total_tokens),
            "--mem-fraction-static", "0.7", "--random-seed", "0", "--watchdog-timeout", "1200",
            "--grammar-backend", "none", "--log-level", "info"]


# ------------------------------------------------------------------------------------------------
# workload and comparison (pure; test/cpu/test_same_tokens_probe.py)
# ------------------------------------------------------------------------------------------------
def band_of(length: int) -> str:
    for lo, hi in BANDS:
        if lo <= length <= hi:
            return f"{lo}-{hi}"
    raise ValueError(f"prompt length {length} outside every band {BANDS}")


def build_workload(vocab: int, seed: int = 0, sizes: Sequence[int] = BATCH_SIZES,
                   repeat_of: Optional[int] = REPEAT_OF) -> List[dict]:
    """[{name, size, prompts}] in send order; request i of a batch takes band i mod 5 (so every
    batch of 5+ covers every band) and a length drawn inside it. The batch of size `repeat_of` is
    sent a second time at the end ("<name>-again": its prompts are radix-cache hits)."""
    rng = random.Random(seed)
    batches = []
    for size in sizes:
        prompts = []
        for i in range(size):
            lo, hi = BANDS[(i + size) % len(BANDS)]
            prompts.append([rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))])
        batches.append({"name": f"bs{size}", "size": size, "prompts": prompts})
    if repeat_of is not None:
        first = next(b for b in batches if b["size"] == repeat_of)
        batches.append({"name": f"{first['name']}-again", "size": repeat_of, "prompts": first["prompts"]})
    return batches


def max_batch_tokens(batches: List[dict]) -> int:
    return max(sum(len(p) + NEW_TOKENS for p in b["prompts"]) for b in batches)


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for t, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return t
    return None if len(a) == len(b) else min(len(a), len(b))


def _share(n: int, total: int) -> Optional[float]:
    return round(n / total, 4) if total else None


def compare(batches: List[dict], ref: List[List[List[int]]], got: List[List[List[int]]]) -> dict:
    """Sequences of `got` identical to `ref` (output ids per batch, per request): overall, by where
    the first difference is (prefill = token 0, decode = later), by prompt band and by batch."""
    if len(ref) != len(batches) or len(got) != len(batches):
        raise ValueError(f"{len(batches)} batches, {len(ref)} / {len(got)} results")
    total = identical = prefill = decode = 0
    by_band: Dict[str, List[int]] = {f"{lo}-{hi}": [0, 0] for lo, hi in BANDS}
    by_batch: Dict[str, List[int]] = {}
    examples = []
    for b, want, have in zip(batches, ref, got):
        if len(want) != b["size"] or len(have) != b["size"]:
            raise ValueError(f"batch {b['name']}: {b['size']} prompts, {len(want)} / {len(have)} results")
        cell = by_batch.setdefault(b["name"], [0, 0])
        for i, (prompt, w, h) in enumerate(zip(b["prompts"], want, have)):
            band = by_band[band_of(len(prompt))]
            total += 1
            band[1] += 1
            cell[1] += 1
            at = first_difference(w, h)
            if at is None:
                identical += 1
                band[0] += 1
                cell[0] += 1
                continue
            if at == 0:
                prefill += 1
            else:
                decode += 1
            if len(examples) < 12:
                examples.append({"batch": b["name"], "request": i, "prompt_len": len(prompt), "token": at})
    return {
        "sequences": total, "identical": identical, "identical_share": _share(identical, total),
        "first_diff_prefill": prefill, "first_diff_decode": decode,
        "by_band": {k: {"identical": v[0], "total": v[1], "share": _share(*v)} for k, v in by_band.items()},
        "by_batch": {k: {"identical": v[0], "total": v[1], "share": _share(*v)} for k, v in by_batch.items()},
        "examples": examples,
    }


def summarize(batches: List[dict], variants: List[dict]) -> Dict[str, dict]:
    """Each variant's comparison against the reference variant's outputs (None when either has
    no outputs); off-b against off-a is the noise floor."""
    by_name = {v["name"]: v for v in variants}
    ref = by_name.get(REFERENCE, {}).get("outputs")
    out = {}
    for v in variants:
        if v["name"] == REFERENCE or ref is None or v.get("outputs") is None:
            out[v["name"]] = None
            continue
        out[v["name"]] = compare(batches, ref, v["outputs"])
    return out


def render_markdown(variants: List[dict], results: Dict[str, Optional[dict]]) -> str:
    bands = [f"{lo}-{hi}" for lo, hi in BANDS]
    lines = [f"| variant | identical | first diff prefill / decode | {' | '.join(bands)} | ready s | switches |",
             "|---|---|---|" + "---|" * len(bands) + "---|---|"]
    for v in variants:
        r = results.get(v["name"])
        if r is None:
            what = "reference" if v["name"] == REFERENCE else (v.get("error") or "no outputs")[:80]
            lines.append(f"| {v['name']} | {what} | | {' | '.join('' for _ in bands)} | "
                         f"{v.get('ready_s', '')} | {v['what']} |")
            continue
        per_band = " | ".join(
            f"{r['by_band'][b]['share']:.3f}" if r["by_band"][b]["share"] is not None else "-" for b in bands)
        lines.append(f"| {v['name']} | {r['identical']}/{r['sequences']} ({r['identical_share']:.4f}) | "
                     f"{r['first_diff_prefill']} / {r['first_diff_decode']} | {per_band} | "
                     f"{v.get('ready_s', '')} | {v['what']} |")
    return "\n".join(lines) + "\n"


def select_variants(text: Optional[str]) -> List[str]:
    names = [n for n in VARIANTS if n not in NAMED_ONLY] if not text else [
        n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
    if REFERENCE not in names:
        raise SystemExit(f"--variants must include the reference {REFERENCE}")
    return names


# ------------------------------------------------------------------------------------------------
# servers (GPU host)
# ------------------------------------------------------------------------------------------------
def launcher():
    """The server harness (sglang.sm120.launcher), imported only where a server starts."""
    from sglang.sm120 import launcher as harness

    return harness


def model_flags_env(model: str):
    """Flags and environment a model needs on the H200 beside the common ones: the DSA model's
    attention (sglang.sm120.tiny.serving), NVFP4's ordered Marlin reduce (repeatable outputs)."""
    flags, env = [], {}
    if model.startswith("glm_moe_dsa-"):
        from sglang.sm120.tiny import serving

        flags, env = serving.dsa_flags(), serving.dsa_env()
    if model.endswith("-nvfp4"):
        env["SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE"] = "1"
    return flags, env


def run_variant(v: dict, srv, batches: List[dict], harness, deadline: float, say) -> None:
    try:
        v["ready_s"] = round(srv.wait_ready(max(30.0, deadline - time.time() - 90), progress=say), 1)
        # an empty radix cache first: the server's warm-up prompt would give 1-token prefix hits
        harness.flush_cache(srv.url)
        outs = []
        t0 = time.time()
        for b in batches:
            res = harness.request_json(srv.url + "/generate", {
                "input_ids": b["prompts"],
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
            }, timeout=max(30.0, deadline - time.time()))
            outs.append([list(r["output_ids"]) for r in res])
        v["outputs"] = outs
        v["workload_s"] = round(time.time() - t0, 1)
        say(f"{v['name']}: ready {v['ready_s']} s, workload {v['workload_s']} s")
    except Exception as e:  # one variant's failure is recorded, the others go on
        v["error"] = f"{type(e).__name__}: {e}"[:2000]
        say(f"{v['name']}: failed: {v['error'][:300]}")
    finally:
        srv.stop()


def log_facts(path: Path) -> dict:
    """What a server log says about the runner: capture reports, eager fallbacks, lab patches."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    reports = [json.loads(ln.split(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("SM120_LAYERWISE_CAPTURE ")]
    keep = ("phase", "full", "layerwise", "dropped", "moe_rows", "moe_rows_fallback", "elapsed_s")
    return {
        "capture_reports": [{k: r.get(k) for k in keep if k in r} for r in reports],
        "eager_fallback_lines": sum("runs eagerly" in ln for ln in text.splitlines()),
        "lab_patches": sorted({ln.split("]")[1].split(":")[0].strip() for ln in text.splitlines()
                               if ln.startswith("[lab variant]")}),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="scratch folder (results and server logs)")
    ap.add_argument("--model", default="glm4_moe-bf16", help="tiny model <arch>-<quant> (python -m sglang.sm120.tiny)")
    ap.add_argument("--models-dir", type=Path,
                    default=Path(os.environ.get("SGLANG_SM120_TINY_DIR", "/tmp/sm120-tiny")))
    ap.add_argument("--variants", help=f"comma-separated subset (default: all); must include {REFERENCE}")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds for the whole run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name, (what, flags, env) in VARIANTS.items():
            print(f"{name:20s} {what}\n{'':20s} {' '.join(flags)} {' '.join(f'{k}={v}' for k, v in env.items())}")
        return 0
    names = select_variants(args.variants)
    harness = launcher()
    t_start = time.time()
    deadline = t_start + args.deadline
    lock = threading.Lock()

    def say(msg: str) -> None:
        with lock:
            print(f"[same-tokens {time.time() - t_start:6.1f}s] {msg}", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    from sglang.sm120.tiny import serving

    model_dir = serving.tiny_model(args.models_dir, *args.model.rsplit("-", 1))
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    batches = build_workload(vocab, args.seed)
    pool = max_batch_tokens(batches) + 8192 * 2  # the largest batch at once, plus a chunk's room
    flags, env = model_flags_env(args.model)
    pythonpath = os.pathsep.join(p for p in (str(REPO / "lab" / "variants"), os.environ.get("PYTHONPATH")) if p)
    variants, threads = [], []
    for name in names:
        what, vflags, venv = VARIANTS[name]
        v = {"name": name, "what": what}
        srv = harness.Server(name=name, model_dir=str(model_dir), log_path=str(args.out / f"server-{name}.log"),
                             args=common_flags(pool) + flags + vflags,
                             env={**env, **venv, "PYTHONPATH": pythonpath})
        v["command"] = " ".join(srv.command())
        v["env"] = {**env, **venv}
        srv.start()
        variants.append(v)
        threads.append(threading.Thread(target=run_variant, args=(v, srv, batches, harness, deadline, say)))
        threads[-1].start()
        time.sleep(2)  # free ports are picked by probing
    for t in threads:
        t.join()
    results = summarize(batches, variants)
    for v in variants:
        v.update(log_facts(args.out / f"server-{v['name']}.log"))
    doc = {
        "what": "greedy tokens of each variant vs graphs disabled (off-a); a probe (issue 43)",
        "model": args.model, "new_tokens": NEW_TOKENS, "bands": [f"{lo}-{hi}" for lo, hi in BANDS],
        "batches": [{"name": b["name"], "size": b["size"], "prompt_tokens": sum(map(len, b["prompts"]))}
                    for b in batches],
        "command": " ".join([sys.executable] + sys.argv),
        "elapsed_s": round(time.time() - t_start, 1),
        "variants": [{k: v for k, v in var.items() if k != "outputs"} for var in variants],
        "results": results,
    }
    (args.out / "same-tokens-probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    table = render_markdown(variants, results)
    (args.out / "same-tokens-probe.md").write_text(f"# same tokens probe: {args.model}\n\n{table}")
    print(table, flush=True)
    say(f"wrote {args.out / 'same-tokens-probe.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
