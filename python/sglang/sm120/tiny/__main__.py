"""python -m sglang.sm120.tiny --arch {qwen3_moe,deepseek_v2,glm_moe_dsa,glm4_moe} --quant {bf16,nvfp4} --out DIR"""
from __future__ import annotations

import argparse
import sys

from .spec import ARCHS, QUANTS, default_spec


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sglang.sm120.tiny",
        description="Write a tiny random-weight MoE checkpoint (bf16 or ModelOpt NVFP4) plus a "
                    "tokenizer with a chat template, fully offline and deterministic from --seed.")
    ap.add_argument("--arch", required=True, choices=ARCHS,
                    help="qwen3_moe: GQA + softmax top-k MoE; deepseek_v2: MLA + DeepSeek-V3/GLM-5 "
                         "style MoE with a shared expert; glm_moe_dsa: GLM-5 (deepseek_v2 plus the "
                         "DSA indexer); glm4_moe: GLM-4.5 (GQA with qkv bias and partial rotary, "
                         "sigmoid MoE with a shared expert)")
    ap.add_argument("--quant", default="bf16", choices=QUANTS)
    ap.add_argument("--out", required=True, help="output directory (created; must be empty)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--layers", type=int, help="decoder layers (default 4 qwen3_moe, 3 the others)")
    ap.add_argument("--hidden", type=int, help="hidden size, multiple of 128 (default 256)")
    ap.add_argument("--experts", type=int, help="routed experts (default 16)")
    ap.add_argument("--top-k", type=int, dest="top_k", help="experts per token (default 4)")
    ap.add_argument("--moe-intermediate", type=int, dest="moe_intermediate",
                    help="expert intermediate size, multiple of 128 (default 256)")
    ap.add_argument("--vocab", type=int, help="vocab size = tokenizer size (default 4096)")
    ap.add_argument("--force", action="store_true", help="replace --out if it is not empty")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    from .build import build  # after argparse so --help needs no torch

    try:
        spec = default_spec(a.arch, a.quant, a.seed, layers=a.layers, hidden=a.hidden,
                            experts=a.experts, top_k=a.top_k, moe_intermediate=a.moe_intermediate,
                            vocab=a.vocab)
        build(a.out, spec, force=a.force)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
