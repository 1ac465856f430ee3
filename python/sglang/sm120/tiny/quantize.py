"""bf16 tiny checkpoint -> ModelOpt NVFP4 checkpoint, with this repo's quantizer (sglang.sm120.nvfp4).

What is quantized (and why the rest is not):
* quantized: every expert's gate/up/down, the shared expert and dense MLP (DeepSeek, GLM), and
  the q/k/v/o projections of the GQA families (Qwen3, GLM-4.5; GLM-4.5's q/k/v biases stay bf16
  as the linear's bias) -- the layers ModelOpt NVFP4 exports quantize in these families.
* kept bf16: ``lm_head`` (sglang quantizes ParallelLMHead unless excluded, and real exports keep
  it high precision), embeddings and norms (not linear layers), the router ``mlp.gate`` (sglang
  builds it with quant_config=None), and for MLA every ``self_attn`` projection: sglang's
  DeepSeek loader splits ``kv_b_proj`` into w_kc/w_vc from a bf16/fp8/int8 weight only (no NVFP4
  branch in post_load_weights), and NVIDIA's DeepSeek NVFP4 exports keep attention unquantized.
  For GLM-5 (glm_moe_dsa) the same ``self_attn*`` pattern keeps the DSA indexer (wq_b, wk,
  weights_proj, k_norm) bf16 too: sglang builds weights_proj with bf16 parameters and no quant
  config whatever the checkpoint says, and the indexer projections are small next to the MoE.

Scales:
* Fused layers share one ``weight_scale_2`` (amax of all members / (6*448)) and one
  ``input_scale``: q/k/v, gate/up (w1/w3 of each expert). sglang keeps only the max
  (linear) or the first (Marlin MoE) of the members' scales, so unequal ones would be wrong.
* ``input_scale`` = ``input_scale_from_amax(calibrated amax)``. Calibration runs the bf16 model
  (reference forward, fp32) over CALIBRATION text and random tokens and records max |x| at each
  linear input. The amax is then rounded UP to a power of two with 2x headroom
  (2**ceil(log2(2*amax))): serving prompts may exceed the calibration max, and power-of-two
  rounding keeps the bytes identical across machines whose fp32 matmuls differ in the last bit.
  All experts of a layer share their w13 and their w2 input_scale (the max over experts): the
  SM120 CUTLASS MoE path takes that max anyway, and experts that calibration routes few tokens
  to would otherwise get a meaningless scale.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from .. import nvfp4
from .spec import DEEPSEEK_MOE_ARCHS, GQA_ARCHS, MLA_ARCHS, TinySpec

GROUP_SIZE = 16
INPUT_AMAX_HEADROOM = 2.0


@dataclass(frozen=True)
class QuantGroup:
    members: Tuple[str, ...]   # linear module names sharing weight_scale_2 and input_scale
    input_key: str             # calibration key whose amax sets input_scale


def exclude_modules(s: TinySpec) -> List[str]:
    """ModelOpt `exclude_modules` patterns (glob, as in NVIDIA's exports)."""
    ex = ["lm_head", "model.layers.*.mlp.gate"]
    if s.arch in MLA_ARCHS:
        ex.append("model.layers.*.self_attn*")
    return ex


def _mlp_groups(p: str, input_key_w13: str, input_key_w2: str) -> List[QuantGroup]:
    return [
        QuantGroup((f"{p}.gate_proj", f"{p}.up_proj"), input_key_w13),
        QuantGroup((f"{p}.down_proj",), input_key_w2),
    ]


def quant_groups(s: TinySpec) -> List[QuantGroup]:
    groups: List[QuantGroup] = []
    for i in range(s.layers):
        p = f"model.layers.{i}"
        if s.arch in GQA_ARCHS:
            a = f"{p}.self_attn"
            groups.append(QuantGroup((f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"), f"{a}.q_proj"))
            groups.append(QuantGroup((f"{a}.o_proj",), f"{a}.o_proj"))
        if s.arch in DEEPSEEK_MOE_ARCHS and i < s.dense_layers:
            groups += _mlp_groups(f"{p}.mlp", f"{p}.mlp.gate_proj", f"{p}.mlp.down_proj")
            continue
        for e in range(s.experts):
            groups += _mlp_groups(f"{p}.mlp.experts.{e}", f"{p}.mlp.experts.*.w13",
                                  f"{p}.mlp.experts.*.w2")
        if s.arch in DEEPSEEK_MOE_ARCHS:
            sh = f"{p}.mlp.shared_experts"
            groups += _mlp_groups(sh, f"{sh}.gate_proj", f"{sh}.down_proj")
    return groups


_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.\d+\.(gate_proj|up_proj|down_proj)$")


def calibration_key(module: str) -> str:
    """Map a linear module name to the key its input amax is pooled under."""
    m = _EXPERT.match(module)
    if m:
        return f"{m.group(1)}.*.{'w2' if m.group(2) == 'down_proj' else 'w13'}"
    return module


def pool_amax(per_module: Dict[str, float]) -> Dict[str, float]:
    pooled: Dict[str, float] = {}
    for name, a in per_module.items():
        k = calibration_key(name)
        pooled[k] = max(a, pooled.get(k, 0.0))
    return pooled


def rounded_amax(amax: float) -> float:
    """Power of two >= INPUT_AMAX_HEADROOM * amax (see module docstring)."""
    if not (amax > 0 and math.isfinite(amax)):
        raise ValueError(f"calibration amax must be finite and > 0, got {amax}")
    return float(2.0 ** math.ceil(math.log2(INPUT_AMAX_HEADROOM * amax)))


def quantize_checkpoint(s: TinySpec, weights: Dict[str, torch.Tensor],
                        input_amax: Dict[str, float],
                        groups: Optional[List[QuantGroup]] = None) -> Dict[str, torch.Tensor]:
    """Return the NVFP4 state dict: quantized members carry weight / weight_scale /
    weight_scale_2 / input_scale; every other tensor is passed through unchanged (bf16).
    `groups` (default: the whole model's) lets a caller quantize one layer at a time."""
    out: Dict[str, torch.Tensor] = {}
    quantized = set()
    for g in quant_groups(s) if groups is None else groups:
        ws = [weights[m + ".weight"] for m in g.members]
        # shared global (decode) scale = amax over all members / (6 * 448), the ModelOpt rule
        shared_ws2 = nvfp4.input_scale_from_amax(max(w.float().abs().max() for w in ws))
        if g.input_key not in input_amax:
            raise KeyError(f"no calibration amax for {g.input_key} (calibration never reached it)")
        in_scale = nvfp4.input_scale_from_amax(rounded_amax(input_amax[g.input_key]))
        for m, w in zip(g.members, ws):
            q = nvfp4.quantize_weight_modelopt(w, weight_scale_2=shared_ws2)
            out[m + ".weight"] = q["weight"]
            out[m + ".weight_scale"] = q["weight_scale"]
            out[m + ".weight_scale_2"] = q["weight_scale_2"].reshape(()).clone()
            out[m + ".input_scale"] = in_scale.reshape(()).clone()
            quantized.add(m + ".weight")
    for name, t in weights.items():
        if name not in quantized:
            out[name] = t
    return dict(sorted(out.items()))


def hf_quant_config(s: TinySpec, producer_version: str) -> dict:
    """hf_quant_config.json in the nested ModelOpt form. The nested form is the one whose
    `exclude_modules` list sglang 0.5.16 reads (the flat config.json form reads `ignore`)."""
    return {
        "producer": {"name": "sglang-sm120-tiny", "version": producer_version},
        "quantization": {
            "quant_algo": "NVFP4",
            "kv_cache_quant_algo": None,
            "group_size": GROUP_SIZE,
            "exclude_modules": exclude_modules(s),
        },
    }


class NVFP4Linears:
    """Linears for the reference forward that use the NVFP4 checkpoint: dequantized weights
    (what Marlin W4A16 computes on SM80-SM90) and, with quantize_activations=True, activations
    quantized with input_scale too (the W4A4 path sglang takes on SM100/SM120)."""

    def __init__(self, qweights: Dict[str, torch.Tensor], quantize_activations: bool):
        self.q = qweights
        self.qa = quantize_activations
        self._w: Dict[str, torch.Tensor] = {}

    def _weight(self, name):
        w = self._w.get(name)
        if w is None:
            t = self.q[name + ".weight"]
            if t.dtype == torch.uint8:
                w = nvfp4.dequantize_weight_modelopt(t, self.q[name + ".weight_scale"],
                                                     self.q[name + ".weight_scale_2"])
            else:
                w = t.to(torch.float32)
            self._w[name] = w
        return w

    def __call__(self, name, x):
        if self.qa and (name + ".input_scale") in self.q and x.numel():
            in_s = self.q[name + ".input_scale"]
            packed, sf = nvfp4.quantize_nvfp4(x, 1.0 / in_s)
            x = nvfp4.dequantize_nvfp4(packed, sf, 1.0 / in_s)
        return x @ self._weight(name).t()
