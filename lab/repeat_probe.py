"""Which part of a tiny model's serving stack answers a repeated greedy batch differently?

Starts one server per variant side by side on the one GPU (the GPU serving tests' flags from
sglang.sm120.tiny.serving, KV pools capped), sends each the same greedy batch REPEATS times, and
writes per variant how many repeats differ from the first and where (request, token).

    PYTHONPATH=/tmp/site python3 lab/repeat_probe.py --out /tmp/res/repeat-probe.json \\
        --variant "base glm_moe_dsa-nvfp4" \\
        --variant "no-overlap glm_moe_dsa-nvfp4 --disable-overlap-schedule" \\
        --variant "marlin-atomic glm_moe_dsa-nvfp4 SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE=0"

A variant is "NAME MODEL [WORD...]": WORDs of the form UPPER_CASE=VALUE go to the server's
environment, the others are appended to its command line (later flags win in sglang's parser).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path

ENV_WORD = re.compile(r"^[A-Z][A-Z0-9_]*=")


def parse_variant(text: str) -> dict:
    words = shlex.split(text)
    if len(words) < 2:
        raise SystemExit(f"--variant {text!r}: expected 'NAME MODEL [WORD...]'")
    env = dict(w.split("=", 1) for w in words[2:] if ENV_WORD.match(w))
    return {"name": words[0], "model": words[1], "args": [w for w in words[2:] if not ENV_WORD.match(w)],
            "env": env}


def first_difference(a: list, b: list):
    """(request, token) of the first differing output id of two batches, or None."""
    for r, (x, y) in enumerate(zip(a, b)):
        for t, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return r, t
        if len(x) != len(y):
            return r, min(len(x), len(y))
    return None


def run_variant(v: dict, srv, repeats: int, payload: dict, request_json, say) -> None:
    try:
        v["ready_s"] = round(srv.wait_ready(900, progress=say), 1)
        batches = []
        for _ in range(repeats):
            out = request_json(srv.url + "/generate", payload, timeout=300)
            batches.append([r["output_ids"] for r in out])
        diffs = [first_difference(batches[0], b) for b in batches[1:]]
        v["differing_repeats"] = sum(d is not None for d in diffs)
        v["first_differences"] = [{"repeat": i + 1, "request": d[0], "token": d[1]}
                                  for i, d in enumerate(diffs) if d is not None]
        v["distinct_batches"] = len({json.dumps(b) for b in batches})
        say(f"{v['name']}: {v['differing_repeats']} of {repeats - 1} repeats differ from the first")
    except Exception as e:  # one variant's failure is recorded, the others go on
        v["error"] = f"{type(e).__name__}: {e}"[:2000]
        say(f"{v['name']}: failed: {v['error'][:300]}")
    finally:
        srv.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="'NAME MODEL [WORD...]' (see above)")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32, help="max_new_tokens of every request")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "scratch" / "repeat-probe.json",
                    help="result JSON; server logs beside it (default lab/scratch/, git-ignored)")
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("SGLANG_SM120_TINY_DIR", "/tmp/sm120-tiny")))
    args = ap.parse_args(argv)
    variants = [parse_variant(t) for t in args.variant]
    if len({v["name"] for v in variants}) != len(variants):
        raise SystemExit("--variant names must be unique")
    if args.repeats < 2:
        raise SystemExit("--repeats: at least 2")
    # several servers share the GPU: tiny.serving then raises the static fraction
    os.environ.setdefault("SGLANG_SM120_GPU_MAX_TOKENS", "2200000")
    from sglang.sm120 import launcher
    from sglang.sm120.tiny import serving
    from sglang.sm120.tiny.prompts import GENERATE_PROMPTS

    t0 = time.time()
    lock = threading.Lock()

    def say(msg: str) -> None:
        with lock:
            print(f"[repeat-probe {time.time() - t0:6.1f}s] {msg}", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    for model in sorted({v["model"] for v in variants}):
        serving.tiny_model(args.models_dir, *model.rsplit("-", 1))
    payload = {"text": list(GENERATE_PROMPTS),
               "sampling_params": {"max_new_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True}}
    threads = []
    for v in variants:
        srv = launcher.Server(name=v["name"], model_dir=str(args.models_dir / v["model"]),
                              log_path=str(args.out.parent / f"repeat-probe-{v['name']}.log"),
                              args=serving.server_args(v["model"]) + v["args"],
                              env={**serving.server_env(v["model"]), **v["env"]})
        v["command"] = shlex.join(srv.command())
        srv.start()
        threads.append(threading.Thread(target=run_variant, args=(v, srv, args.repeats, payload, launcher.request_json, say)))
        threads[-1].start()
        time.sleep(5)  # start-ups pick free ports by probing
    for t in threads:
        t.join()
    result = {
        "what": "greedy batch repeated on one server per variant; differing_repeats counts repeats "
                "whose output ids differ from the first",
        "commit": os.environ.get("SGLANG_SM120_COMMIT", "unknown"),
        "command": shlex.join([sys.executable] + sys.argv),
        "repeats": args.repeats, "max_new_tokens": args.tokens, "prompts": len(GENERATE_PROMPTS),
        "variants": variants,
        "targets": {f"{v['name']}_differing_repeats": {
            "value": v.get("differing_repeats"), "target": 0,
            "met": v.get("differing_repeats") == 0} for v in variants},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    say(f"wrote {args.out}")
    return 0 if all(t["met"] for t in result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
