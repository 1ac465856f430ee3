"""Random-weight ModelOpt NVFP4 checkpoints at a real model's shapes, made on a GPU in about a minute.

    python -m sglang.sm120.tiny.fullsize --preset qwen3-30b-a3b --device cuda --out DIR

Same weight names, init rules, quantizer and config as the tiny factory (tiny/), so upstream
sglang loads it unchanged; what differs is what full size cannot afford:

* weights are drawn and quantized on `--device` (a CUDA generator: other numbers than the CPU
  one, reproducible on one GPU type and torch version), one decoder layer at a time, and written
  as safetensors shards plus `model.safetensors.index.json`;
* no calibration and no reference forward (hours of fp32 on a CPU): every `input_scale` comes
  from FIXED_INPUT_AMAX, a generous bound on the activations these init rules produce. It is
  unused by the W4A16 (Marlin) path of SM80-SM90; on SM120 (W4A4) it only has to be finite;
* the tokenizer is the tiny byte-level BPE at its largest size (tokenizer.MAX_VOCAB), while
  config.json keeps the real vocab_size; LM-head rows past the tokenizer are zero, so a
  token the tokenizer cannot decode is never the greedy choice (real checkpoints pad the same
  way, e.g. Qwen3's 151,669 tokens for 151,936 rows).

The result is for benchmarks (weight bytes, kernels and shapes as real): it generates nonsense.
`fullsize_model.json` records the spec, device and scales used; there is no tiny_reference.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Dict, List

import torch

from ..model_shapes import QWEN3_30B_A3B_CONFIG
from . import quantize, spec as spec_mod, weights
from .build import _dump_json, _one_thread, build, write_tokenizer_and_config
from .spec import MAX_VOCAB, TinySpec

FORMAT_VERSION = 1
INFO_FILE = "fullsize_model.json"
INDEX_FILE = "model.safetensors.index.json"
# max |x| assumed at each linear input, by calibration-key suffix (see module docstring).
# Normalised inputs (qkv, w13) have unit RMS, max ~5 over a 2048-wide row; attention outputs
# are averages of unit values; silu(gate)*up has heavier tails. rounded_amax() adds 2x on top.
FIXED_INPUT_AMAX = {"q_proj": 8.0, "o_proj": 8.0, "w13": 8.0, "w2": 16.0}


def _spec_from_hf(cfg: dict, **kw) -> TinySpec:
    return TinySpec(
        arch="qwen3_moe", hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"], experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
        moe_intermediate=cfg["moe_intermediate_size"], vocab=cfg["vocab_size"],
        max_position=cfg["max_position_embeddings"], **kw)


PRESETS = {"qwen3-30b-a3b": QWEN3_30B_A3B_CONFIG}


def preset_spec(preset: str, seed: int = 0, layers: int = None) -> TinySpec:
    if preset not in PRESETS:
        raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    s = _spec_from_hf(PRESETS[preset], quant="nvfp4", seed=seed)
    return s.replace(layers=layers) if layers is not None else s


def validate(s: TinySpec, tokenizer_vocab: int) -> None:
    """The tiny rules (raising ValueError naming the option) except the vocab cap, which only
    binds the tokenizer here."""
    spec_mod.validate(s.replace(vocab=tokenizer_vocab))
    if s.quant != "nvfp4":
        raise ValueError(f"--quant: full-size models are NVFP4 only, got {s.quant!r}")
    if s.vocab < tokenizer_vocab:
        raise ValueError(f"--tokenizer-vocab ({tokenizer_vocab}) must not exceed the model's "
                         f"vocab ({s.vocab})")


def input_amax(groups: List[quantize.QuantGroup]) -> Dict[str, float]:
    return {g.input_key: FIXED_INPUT_AMAX[g.input_key.rsplit(".", 1)[1]] for g in groups}


def groups_by_layer(s: TinySpec) -> Dict[int, List[quantize.QuantGroup]]:
    out: Dict[int, List[quantize.QuantGroup]] = defaultdict(list)
    for g in quantize.quant_groups(s):
        out[int(g.members[0].split(".")[2])].append(g)
    return out


def shard_plan(layers: int, layers_per_shard: int) -> List[List[int]]:
    """Layer indices per shard; the embedding joins the first shard, the final norm and LM head
    get the last one of their own."""
    return [list(range(i, min(i + layers_per_shard, layers)))
            for i in range(0, layers, layers_per_shard)] + [[]]


class _ShardWriter:
    def __init__(self, d: str, n: int):
        self.d, self.n, self.i = d, n, 0
        self.weight_map: Dict[str, str] = {}
        self.total = 0

    def write(self, tensors: Dict[str, torch.Tensor]) -> str:
        from safetensors.torch import save_file

        self.i += 1
        name = f"model-{self.i:05d}-of-{self.n:05d}.safetensors"
        save_file({k: v.contiguous() for k, v in sorted(tensors.items())},
                  os.path.join(self.d, name), metadata={"format": "pt"})
        for k, v in tensors.items():
            self.weight_map[k] = name
            self.total += v.numel() * v.element_size()
        return name

    def finish(self) -> None:
        _dump_json(os.path.join(self.d, INDEX_FILE), {
            "metadata": {"total_size": self.total}, "weight_map": dict(sorted(self.weight_map.items()))})


def _to_cpu(named: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v.to("cpu") for k, v in named.items()}


def make_writer(device: str, tokenizer_vocab: int, layers_per_shard: int):
    """A build.build `write` callable for a full-size model on `device`."""

    def write(d: str, s: TinySpec, log, t0: float) -> None:
        if device == "cpu":  # many small ops: one thread is far faster on a busy machine
            with _one_thread():
                return _write(d, s, log, t0)
        return _write(d, s, log, t0)

    def _write(d: str, s: TinySpec, log, t0: float) -> None:
        def step(msg):
            log(f"{s.name} full-size: {msg} ({time.time() - t0:.1f}s)")

        _, ids = write_tokenizer_and_config(d, s, tokenizer_vocab)
        _dump_json(os.path.join(d, "hf_quant_config.json"),
                   quantize.hf_quant_config(s, f"fullsize-v{FORMAT_VERSION}"))
        step(f"tokenizer ({tokenizer_vocab} tokens) and config (vocab {s.vocab})")
        plan = shard_plan(s.layers, layers_per_shard)
        out = _ShardWriter(d, len(plan))
        by_layer = groups_by_layer(s)
        draw = weights._Draw(s.seed, device)
        pending = _to_cpu(dict(weights.embedding(draw, s)))
        for shard_layers in plan[:-1]:
            for i in shard_layers:
                w = dict(weights.layer(draw, s, i))
                q = quantize.quantize_checkpoint(s, w, input_amax(by_layer[i]), by_layer[i])
                del w
                pending.update(_to_cpu(q))
                del q
            name = out.write(pending)
            pending = {}
            step(f"layers {shard_layers[0]}-{shard_layers[-1]} of {s.layers} -> {name}")
        last = dict(weights.head(draw, s))
        last["lm_head.weight"][tokenizer_vocab:] = 0
        out.write(_to_cpu(last))
        out.finish()
        _dump_json(os.path.join(d, INFO_FILE), {
            "format_version": FORMAT_VERSION, "spec": s.to_dict(), "special_ids": ids,
            "device": device, "torch": torch.__version__, "tokenizer_vocab": tokenizer_vocab,
            "fixed_input_amax": FIXED_INPUT_AMAX, "bytes": out.total,
            "note": "random weights for benchmarks; no calibration, no reference scores",
        })
        step(f"{out.total / 1e9:.2f} GB of tensors in {len(plan)} shards")

    return write


def build_fullsize(out_dir: str, s: TinySpec, device: str = "cuda",
                   tokenizer_vocab: int = MAX_VOCAB, layers_per_shard: int = 4,
                   force: bool = False, log=None) -> str:
    validate(s, tokenizer_vocab)
    if layers_per_shard < 1:
        raise ValueError(f"--layers-per-shard must be >= 1, got {layers_per_shard}")
    kw = {} if log is None else {"log": log}
    return build(out_dir, s, force=force, write=make_writer(device, tokenizer_vocab, layers_per_shard), **kw)


def matches(model_dir: str, s: TinySpec) -> bool:
    """True when model_dir holds a finished full-size build of exactly this spec."""
    try:
        with open(os.path.join(model_dir, INFO_FILE), encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    return info.get("spec") == s.to_dict() and info.get("format_version") == FORMAT_VERSION


def checkpoint_gb(s: TinySpec) -> float:
    """Approximate size: NVFP4 experts and attention (0.5625 B/param), bf16 embedding + head."""
    experts = s.layers * s.experts * 3 * s.moe_intermediate * s.hidden
    attn = s.layers * (s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim + s.heads * s.head_dim * s.hidden)
    return (0.5625 * (experts + attn) + 2 * 2 * s.vocab * s.hidden) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120.tiny.fullsize",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, help="output directory (created; must be empty)")
    ap.add_argument("--device", default="cuda", help="where weights are drawn and quantized (default cuda)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="fewer decoder layers than the preset (for quick tests)")
    ap.add_argument("--tokenizer-vocab", type=int, default=MAX_VOCAB, dest="tokenizer_vocab")
    ap.add_argument("--layers-per-shard", type=int, default=4, dest="layers_per_shard")
    ap.add_argument("--force", action="store_true", help="replace --out if it is not empty")
    ap.add_argument("--reuse", action="store_true",
                    help="exit 0 without building when --out already holds this exact model")
    a = ap.parse_args(argv)
    try:
        s = preset_spec(a.preset, a.seed, a.layers)
        if a.reuse and matches(a.out, s):
            print(f"[fullsize] {a.out} already holds {s.name} ({a.preset}); reusing it", file=sys.stderr)
            return 0
        if a.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible (pass --device cpu, slowly)")
        print(f"[fullsize] {a.preset}: {s.layers} layers, {s.experts} experts, ~{checkpoint_gb(s):.1f} GB "
              f"on {a.device}", file=sys.stderr, flush=True)
        build_fullsize(a.out, s, a.device, a.tokenizer_vocab, a.layers_per_shard, force=a.force or a.reuse)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
