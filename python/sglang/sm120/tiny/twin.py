"""The GLM-5 rank twin: one TP-8 rank of GLM-5-NVFP4 as a TP-1 model, config only.

    python -m sglang.sm120.tiny.twin --out DIR [--variant experts-fp4|all-fp4]

`GlmMoeDsaForCausalLM` with the per-GPU shapes of one rank of GLM-5 at TP 8: hidden 6144 and
78 layers (first 3 dense), attention heads 64/8, GLM-5's MLA ranks (q_lora 2048, kv_lora 512,
qk_nope 192, qk_rope 64, v_head 256) and DSA indexer (32 heads x 128, top-k 2048, replicated
at TP 8 as sglang builds it), 256 routed experts top-8 with moe_intermediate 2048/8, one shared
expert (2048/8), dense intermediate 12288/8, vocabulary 154880/8, sigmoid noaux_tc routing,
routed_scaling_factor 2.5. The folder holds config.json, a small tokenizer and the ModelOpt
hf_quant_config.json; weights come from `--load-format dummy` on the GPU (router: see
sglang.sm120.tiny.twin_router).

Variants (what ModelOpt's `exclude_modules` keeps BF16):
* experts-fp4 (the common GLM-5-NVFP4 checkpoints): only the routed experts are NVFP4; attention
  (MLA projections and the DSA indexer), the 3 dense layers, the shared experts, the router and
  lm_head stay BF16.
* all-fp4: every linear sglang runs in NVFP4 here. Kept BF16 even so: lm_head and the router
  (sglang builds the gate without a quant config), kv_b_proj (sglang's DeepSeek loader splits it
  into w_kc/w_vc from a bf16/fp8/int8 weight only) and the DSA indexer (sglang builds
  weights_proj bf16 whatever the checkpoint says; wq_b/wk are kept with it).

`weight_bytes` counts the per-GPU weight bytes from these shapes and dtypes (NVFP4: 0.5 B per
weight + one e4m3 scale per 16 + fp32 weight_scale_2 and input_scale per linear); the CLI
prints it beside the field's 57.06 GB per GPU (a public deployment report).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterator, List, Tuple

TP = 8  # the deployment the twin is one rank of
FIELD_WEIGHT_GB = 57.06  # per GPU, GLM-5-NVFP4 at TP 8 on RTX PRO 6000 (public deployment report; sglang's "GB" = GiB)
FIELD_KV_TOKENS = 314_000  # bf16 KV per GPU at --mem-fraction-static 0.92 (the same report)
FIELD_MEM_FRACTION = 0.92
VARIANTS = ("experts-fp4", "all-fp4")
TOKENIZER_VOCAB = 1000  # one_batch feeds token ids; the tokenizer only has to load

# GLM-5's published shapes, whole model
GLM5 = dict(hidden=6144, layers=78, dense_layers=3, heads=64, dense_intermediate=12288, experts=256,
            top_k=8, moe_intermediate=2048, shared_experts=1, vocab=154880, q_lora_rank=2048,
            kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
            index_n_heads=32, index_head_dim=128, index_topk=2048, routed_scaling_factor=2.5,
            max_position=202752)


def rank_shapes(tp: int = TP) -> dict:
    """GLM-5's dimensions as one rank of TP `tp` sees them (column/row-parallel dims / tp)."""
    s = dict(GLM5)
    for k in ("heads", "dense_intermediate", "moe_intermediate", "vocab"):
        if s[k] % tp:
            raise ValueError(f"GLM-5's {k} ({s[k]}) does not divide by TP {tp}")
        s[k] //= tp
    return s


def twin_spec(seed: int = 0):
    from .spec import TinySpec

    return TinySpec(arch="glm_moe_dsa", quant="nvfp4", seed=seed, **rank_shapes())


def exclude_modules(variant: str, dense_layers: int = GLM5["dense_layers"]) -> List[str]:
    """ModelOpt exclude_modules (globs, matched whole by sglang's is_layer_excluded)."""
    if variant not in VARIANTS:
        raise ValueError(f"--variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    always = ["lm_head", "model.layers.*.mlp.gate", "model.layers.*.self_attn.indexer*"]
    if variant == "all-fp4":
        return always + ["model.layers.*.self_attn.kv_b_proj"]
    return always + ["model.layers.*.self_attn*", *[f"model.layers.{i}.mlp*" for i in range(dense_layers)],
                     "model.layers.*.mlp.shared_experts*"]


def hf_quant_config(variant: str) -> dict:
    return {"producer": {"name": "sglang-sm120-twin", "version": variant},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": exclude_modules(variant)}}


@dataclass(frozen=True)
class Tensor:
    name: str       # checkpoint name of the module (linears) or tensor
    shape: Tuple[int, ...]  # (N, K) for linears
    linear: bool
    count: int = 1  # identical modules it stands for (the routed experts of one layer)
    dtype_bytes: int = 2  # when not NVFP4


def tensors(s: dict) -> Iterator[Tensor]:
    """Every weight of the twin, linears by their module name (routed experts one per layer, x256)."""
    h, nh = s["hidden"], s["heads"]
    lin = lambda name, n, k, count=1: Tensor(name, (n, k), True, count)  # noqa: E731
    yield Tensor("model.embed_tokens.weight", (s["vocab"], h), False)
    for i in range(s["layers"]):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        yield lin(f"{a}.q_a_proj", s["q_lora_rank"], h)
        yield lin(f"{a}.kv_a_proj_with_mqa", s["kv_lora_rank"] + s["qk_rope_head_dim"], h)
        yield lin(f"{a}.q_b_proj", nh * (s["qk_nope_head_dim"] + s["qk_rope_head_dim"]), s["q_lora_rank"])
        yield lin(f"{a}.kv_b_proj", nh * (s["qk_nope_head_dim"] + s["v_head_dim"]), s["kv_lora_rank"])
        yield lin(f"{a}.o_proj", h, nh * s["v_head_dim"])
        yield lin(f"{a}.indexer.wq_b", s["index_n_heads"] * s["index_head_dim"], s["q_lora_rank"])
        yield lin(f"{a}.indexer.wk", s["index_head_dim"], h)
        yield lin(f"{a}.indexer.weights_proj", s["index_n_heads"], h)
        for norm, width in (("input_layernorm", h), ("post_attention_layernorm", h),
                            ("self_attn.q_a_layernorm", s["q_lora_rank"]),
                            ("self_attn.kv_a_layernorm", s["kv_lora_rank"]),
                            ("self_attn.indexer.k_norm", 2 * s["index_head_dim"])):  # LayerNorm: weight + bias
            yield Tensor(f"{p}.{norm}.weight", (width,), False)
        if i < s["dense_layers"]:
            m, inter = f"{p}.mlp", s["dense_intermediate"]
            yield from (lin(f"{m}.gate_proj", inter, h), lin(f"{m}.up_proj", inter, h), lin(f"{m}.down_proj", h, inter))
            continue
        m, inter, e = f"{p}.mlp", s["moe_intermediate"], s["experts"]
        yield lin(f"{m}.gate", e, h)
        yield Tensor(f"{m}.gate.e_score_correction_bias", (e,), False, dtype_bytes=4)
        for proj, n, k in (("gate_proj", inter, h), ("up_proj", inter, h), ("down_proj", h, inter)):
            yield lin(f"{m}.experts.*.{proj}", n, k, count=e)
            yield lin(f"{m}.shared_experts.{proj}", n, k)  # GLM-5 has one shared expert
    yield Tensor("model.norm.weight", (h,), False)
    yield Tensor("lm_head.weight", (s["vocab"], h), False)


def is_excluded(name: str, patterns: List[str]) -> bool:
    # a routed expert's stand-in name carries "*"; expert 0 is matched for all of them
    concrete = name.replace("experts.*.", "experts.0.")
    return any(fnmatch.fnmatchcase(concrete, p) for p in patterns)


def nvfp4_bytes(n: int, k: int) -> int:
    """Packed e2m1 weights, one e4m3 scale per 16 along K, fp32 weight_scale_2 + input_scale."""
    return n * k // 2 + n * k // 16 + 8


def weight_bytes(variant: str, s: dict = None) -> Dict[str, int]:
    """Per-GPU weight bytes by part (and "total") for the variant."""
    s = s or rank_shapes()
    ex = exclude_modules(variant)
    parts: Dict[str, int] = {}
    for t in tensors(s):
        if t.linear and not is_excluded(t.name, ex):
            b = nvfp4_bytes(*t.shape)
        else:
            b = t.dtype_bytes
            for d in t.shape:
                b *= d
        part = _part(t.name)
        parts[part] = parts.get(part, 0) + b * t.count
    parts["total"] = sum(parts.values())
    return parts


def _part(name: str) -> str:
    if ".experts." in name:
        return "routed_experts"
    if ".shared_experts." in name:
        return "shared_experts"
    if ".indexer." in name:
        return "indexer"
    if ".self_attn." in name:
        return "attention"
    if name.endswith((".mlp.gate", ".mlp.gate.e_score_correction_bias")):
        return "router"
    if ".mlp." in name:
        return "dense_mlp"
    if name.startswith(("model.embed_tokens", "lm_head")):
        return "embedding_lm_head"
    return "norms"


def write_tokenizer(d: str) -> None:
    """A small word-level tokenizer (one_batch loads one; the GPU host is offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(TOKENIZER_VOCAB - 3)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(d, "tokenizer.json"))
    _dump(os.path.join(d, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": GLM5["max_position"]})


def config(variant: str) -> dict:
    from .spec import hf_config

    cfg = hf_config(twin_spec(), {"bos": 1, "eos": 2, "pad": 0})
    cfg["sglang_sm120_twin"] = {"of": "GLM-5 at TP 8, one rank", "tp": TP, "variant": variant}
    return cfg


def _dump(path: str, doc: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def write(out: str, variant: str) -> Dict[str, int]:
    """Write the twin's folder; returns weight_bytes(variant)."""
    if os.path.isdir(out) and os.listdir(out):
        existing = os.path.join(out, "config.json")
        if not os.path.isfile(existing):
            raise FileExistsError(f"--out {out} is not empty and holds no twin")
    os.makedirs(out, exist_ok=True)
    _dump(os.path.join(out, "config.json"), config(variant))
    _dump(os.path.join(out, "hf_quant_config.json"), hf_quant_config(variant))
    write_tokenizer(out)
    return weight_bytes(variant)


def render_bytes(variant: str, parts: Dict[str, int]) -> str:
    lines = [f"GLM-5 rank twin ({variant}), per-GPU weight bytes from shapes and dtypes:"]
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        if k != "total":
            lines.append(f"  {k:<18} {v / 1e9:7.2f} GB  {v / 2**30:7.2f} GiB")
    t = parts["total"]
    lines.append(f"  {'total':<18} {t / 1e9:7.2f} GB  {t / 2**30:7.2f} GiB   field: {FIELD_WEIGHT_GB} GB per GPU "
                 f"(sglang's load log, GiB; includes what the field's checkpoint adds, e.g. its MTP layer)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120.tiny.twin", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for config.json, tokenizer, hf_quant_config.json")
    ap.add_argument("--variant", default="experts-fp4", choices=VARIANTS)
    a = ap.parse_args(argv)
    try:
        parts = write(a.out, a.variant)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render_bytes(a.variant, parts))
    print(f"wrote {a.out} (config only: run with --load-format dummy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
