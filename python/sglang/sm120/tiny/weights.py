"""Random bf16 weights with the parameter names of the real HF checkpoints of each family.

One `torch.Generator` seeded with the model seed draws every tensor in a fixed order, so the bytes
depend only on (spec, seed). The scales keep the residual stream at unit RMS: every projection
that reads a normalised activation has std 1/sqrt(K) (outputs ~unit RMS), the projections that
write back into the residual stream (o_proj, down_proj) are scaled by RESIDUAL_GAIN so each block
adds a sizeable but not dominant update, and the LM head gives logits of std LOGIT_STD so greedy
decoding has clear winners (a random model with std-0.02 weights has near-flat logits, where
bf16 and NVFP4 would disagree on noise).
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from .spec import DEEPSEEK_MOE_ARCHS, TinySpec

RESIDUAL_GAIN = 0.7   # RMS of a block's output relative to the residual stream
ROUTER_STD = 2.0      # std of router logits
LOGIT_STD = 6.0       # std of final logits
NORM_JITTER = 0.1     # norm weights are 1 + N(0, NORM_JITTER): a wrongly loaded norm shows
BIAS_STD = 0.05       # DeepSeek-V3 e_score_correction_bias

Named = List[Tuple[str, torch.Tensor]]


class _Draw:
    """Draws on `device` from one generator there (a CUDA generator gives other numbers than
    the CPU one, so only full-size models, which have no CPU reference, draw on a GPU)."""

    def __init__(self, seed: int, device: str = "cpu"):
        self.g = torch.Generator(device=device)
        self.g.manual_seed(seed)
        self.device = torch.device(device)

    def normal(self, shape, std: float, dtype=torch.bfloat16) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.g, dtype=torch.float32, device=self.device) * std
        return t.to(dtype)

    def linear(self, n: int, k: int, gain: float = 1.0) -> torch.Tensor:
        return self.normal((n, k), gain / math.sqrt(k))

    def norm(self, n: int) -> torch.Tensor:
        return (1.0 + torch.randn(n, generator=self.g, device=self.device) * NORM_JITTER).to(torch.bfloat16)


def _mlp(d: _Draw, prefix: str, hidden: int, inter: int) -> Named:
    return [
        (f"{prefix}.gate_proj.weight", d.linear(inter, hidden)),
        (f"{prefix}.up_proj.weight", d.linear(inter, hidden)),
        (f"{prefix}.down_proj.weight", d.linear(hidden, inter, RESIDUAL_GAIN)),
    ]


def _experts(d: _Draw, prefix: str, s: TinySpec) -> Named:
    out = [(f"{prefix}.gate.weight", d.linear(s.experts, s.hidden, ROUTER_STD))]
    if s.arch in DEEPSEEK_MOE_ARCHS:
        out.append((f"{prefix}.gate.e_score_correction_bias",
                    d.normal((s.experts,), BIAS_STD, torch.float32)))
    for e in range(s.experts):
        out += _mlp(d, f"{prefix}.experts.{e}", s.hidden, s.moe_intermediate)
    if s.arch in DEEPSEEK_MOE_ARCHS:
        out += _mlp(d, f"{prefix}.shared_experts", s.hidden, s.moe_intermediate * s.shared_experts)
    return out


def _qwen3_attention(d: _Draw, p: str, s: TinySpec) -> Named:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [
        (f"{p}.q_proj.weight", d.linear(q, s.hidden)),
        (f"{p}.k_proj.weight", d.linear(kv, s.hidden)),
        (f"{p}.v_proj.weight", d.linear(kv, s.hidden)),
        (f"{p}.o_proj.weight", d.linear(s.hidden, q, RESIDUAL_GAIN)),
        (f"{p}.q_norm.weight", d.norm(s.head_dim)),
        (f"{p}.k_norm.weight", d.norm(s.head_dim)),
    ]


def _glm4_attention(d: _Draw, p: str, s: TinySpec) -> Named:
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [
        (f"{p}.q_proj.weight", d.linear(q, s.hidden)),
        (f"{p}.q_proj.bias", d.normal((q,), BIAS_STD)),
        (f"{p}.k_proj.weight", d.linear(kv, s.hidden)),
        (f"{p}.k_proj.bias", d.normal((kv,), BIAS_STD)),
        (f"{p}.v_proj.weight", d.linear(kv, s.hidden)),
        (f"{p}.v_proj.bias", d.normal((kv,), BIAS_STD)),
        (f"{p}.o_proj.weight", d.linear(s.hidden, q, RESIDUAL_GAIN)),
    ]


def _dsa_indexer(d: _Draw, p: str, s: TinySpec) -> Named:
    """GLM-5's indexer: q from the q LoRA, one shared key (LayerNorm with bias), per-head gates."""
    return [
        (f"{p}.wq_b.weight", d.linear(s.index_n_heads * s.index_head_dim, s.q_lora_rank)),
        (f"{p}.wk.weight", d.linear(s.index_head_dim, s.hidden)),
        (f"{p}.k_norm.weight", d.norm(s.index_head_dim)),
        (f"{p}.k_norm.bias", d.normal((s.index_head_dim,), NORM_JITTER)),
        (f"{p}.weights_proj.weight", d.linear(s.index_n_heads, s.hidden)),
    ]


def _mla_attention(d: _Draw, p: str, s: TinySpec) -> Named:
    qk = s.qk_nope_head_dim + s.qk_rope_head_dim
    out: Named = []
    if s.q_lora_rank:
        out += [
            (f"{p}.q_a_proj.weight", d.linear(s.q_lora_rank, s.hidden)),
            (f"{p}.q_a_layernorm.weight", d.norm(s.q_lora_rank)),
            (f"{p}.q_b_proj.weight", d.linear(s.heads * qk, s.q_lora_rank)),
        ]
    else:
        out.append((f"{p}.q_proj.weight", d.linear(s.heads * qk, s.hidden)))
    out += [
        (f"{p}.kv_a_proj_with_mqa.weight", d.linear(s.kv_lora_rank + s.qk_rope_head_dim, s.hidden)),
        (f"{p}.kv_a_layernorm.weight", d.norm(s.kv_lora_rank)),
        (f"{p}.kv_b_proj.weight",
         d.linear(s.heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank)),
        (f"{p}.o_proj.weight", d.linear(s.hidden, s.heads * s.v_head_dim, RESIDUAL_GAIN)),
    ]
    if s.arch == "glm_moe_dsa":
        out += _dsa_indexer(d, f"{p}.indexer", s)
    return out


def embedding(d: _Draw, s: TinySpec) -> Named:
    return [("model.embed_tokens.weight", d.normal((s.vocab, s.hidden), 1.0))]


def layer(d: _Draw, s: TinySpec, i: int) -> Named:
    """Decoder layer i, drawn in checkpoint order."""
    p = f"model.layers.{i}"
    named: Named = [(f"{p}.input_layernorm.weight", d.norm(s.hidden))]
    if s.arch == "qwen3_moe":
        named += _qwen3_attention(d, f"{p}.self_attn", s)
    elif s.arch == "glm4_moe":
        named += _glm4_attention(d, f"{p}.self_attn", s)
    else:
        named += _mla_attention(d, f"{p}.self_attn", s)
    named.append((f"{p}.post_attention_layernorm.weight", d.norm(s.hidden)))
    if s.arch in DEEPSEEK_MOE_ARCHS and i < s.dense_layers:
        named += _mlp(d, f"{p}.mlp", s.hidden, s.dense_intermediate)
    else:
        named += _experts(d, f"{p}.mlp", s)
    return named


def head(d: _Draw, s: TinySpec) -> Named:
    return [("model.norm.weight", d.norm(s.hidden)),
            ("lm_head.weight", d.linear(s.vocab, s.hidden, LOGIT_STD))]


def init_weights(s: TinySpec) -> Dict[str, torch.Tensor]:
    """All bf16 tensors (the expert score-correction bias is fp32, as in DeepSeek-V3 and GLM), HF
    names."""
    d = _Draw(s.seed)
    named = embedding(d, s)
    for i in range(s.layers):
        named += layer(d, s, i)
    named += head(d, s)
    return dict(named)
