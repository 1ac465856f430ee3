"""One engine of the layerwise stage (a process of its own, so a crash or a hang stays contained
and its GPU memory is freed): greedy generation of the given prompts, tokens and logprobs as JSON.

    python -m sglang.sm120.check.layerwise_worker --model DIR --mode {disabled,layerwise} \
        --prompts FILE --out FILE [--new-tokens N] [--max-running R] [--chunk C]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

TOP_LOGPROBS = 5
MODES = ("disabled", "layerwise")


# KV pool of the tiny model: the grids' largest batch holds ~10k tokens at once; a small fixed pool
# keeps the engine's memory the same on a 32 GB card and a 141 GB one.
MAX_TOTAL_TOKENS = 32768


def engine_kwargs(mode: str, max_running: int, chunk: int) -> dict:
    """Graphs disabled for both phases, or the layerwise runner for both at every decode size
    (so that small batches run layerwise segments too, not upstream's full graphs)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    kw = dict(attention_backend="flashinfer", sampling_backend="flashinfer", max_running_requests=max_running,
              chunked_prefill_size=chunk, mem_fraction_static=0.3, max_total_tokens=MAX_TOTAL_TOKENS,
              disable_radix_cache=True, random_seed=0, log_level="error")
    if mode == "disabled":
        kw.update(cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled")
    else:
        kw.update(cuda_graph_backend_decode="layerwise", cuda_graph_backend_prefill="layerwise",
                  cuda_graph_layerwise_every_size=True)
    return kw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120.check.layerwise_worker")
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", required=True, choices=MODES)
    ap.add_argument("--prompts", required=True, help="JSON: list of batches, each a list of token-id lists")
    ap.add_argument("--out", required=True)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=512)
    a = ap.parse_args(argv)
    os.environ.setdefault("SGLANG_SM120_DYNAMO_FREE", "1")  # the eager MoE helpers layerwise needs
    import sglang

    batches = json.loads(open(a.prompts).read())
    t0 = time.time()
    engine = sglang.Engine(model_path=a.model, **engine_kwargs(a.mode, a.max_running, a.chunk))
    started = time.time() - t0
    try:
        outs = []
        for prompts in batches:
            res = engine.generate(input_ids=prompts,
                                  sampling_params={"temperature": 0, "max_new_tokens": a.new_tokens, "ignore_eos": True},
                                  return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
            for r in res:
                mi = r["meta_info"]
                outs.append({
                    "tokens": [int(t) for _, t, _ in mi["output_token_logprobs"]],
                    "logprobs": [float(lp) for lp, _, _ in mi["output_token_logprobs"]],
                    "top": [{str(int(t)): float(lp) for lp, t, _ in (pos or [])} for pos in mi["output_top_logprobs"]],
                })
    finally:
        engine.shutdown()
    with open(a.out, "w") as f:
        json.dump({"mode": a.mode, "startup_s": round(started, 1), "total_s": round(time.time() - t0, 1),
                   "outputs": outs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
