"""A plain fp32 PyTorch forward of the tiny families, for calibration and error estimates on CPU.

It follows the HF reference semantics of Qwen3-MoE, DeepSeek-V3, GLM-5 (glm_moe_dsa) and GLM-4.5
(glm4_moe) (the CPU test checks it against transformers' own implementation).
GLM-5's DSA: the indexer scores every earlier key (bf16-equivalent formula of transformers'
GlmMoeDsaIndexer: sum over indexer heads of gate * relu(q.k) * scale; the Hadamard rotation that
sglang applies to q and k is orthogonal and leaves q.k unchanged) and attention keeps the
index_topk best. A sequence of at most index_topk tokens keeps every earlier key, so there the
forward is dense MLA and the indexer is skipped; sglang's FP8 indexer can only change the choice
on longer sequences. Every linear layer goes through `Linears.__call__`
with its module name, so callers can record activation ranges (calibration) or swap in NVFP4
weights and activation quantization (simulation) without touching the model code.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F

from .spec import DEEPSEEK_MOE_ARCHS, TinySpec, rope_theta, rotary_dim

EPS = 1e-6


class Linears:
    """name -> y = x @ W^T with the checkpoint's weight; subclasses change how."""

    def __init__(self, weights: Dict[str, torch.Tensor]):
        self.weights = weights
        self._f32: Dict[str, torch.Tensor] = {}

    def weight(self, name: str) -> torch.Tensor:
        w = self._f32.get(name)
        if w is None:
            w = self.weights[name + ".weight"].to(torch.float32)
            self._f32[name] = w
        return w

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight(name).t()


class AmaxRecorder(Linears):
    """Records max |input| per linear module name (the ModelOpt activation calibration)."""

    def __init__(self, weights):
        super().__init__(weights)
        self.amax: Dict[str, float] = {}

    def __call__(self, name, x):
        if x.numel():
            a = float(x.abs().max())
            self.amax[name] = max(a, self.amax.get(name, 0.0))
        return super().__call__(name, x)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.to(torch.float32)


def _rope_cos_sin(positions: torch.Tensor, dim: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = positions.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.float32), emb.sin().to(torch.float32)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rope(x: torch.Tensor, cos, sin, interleaved: bool) -> torch.Tensor:
    """x [T, H, D]. interleaved=True is GPT-J pairing (DeepSeek's rope_interleave): reorder the
    pairs into halves first; q and k get the same permutation, so dot products are unchanged."""
    if interleaved:
        t, h, d = x.shape
        x = x.view(t, h, d // 2, 2).transpose(-1, -2).reshape(t, h, d)
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def _partial_rope(x: torch.Tensor, cos, sin, interleaved: bool = False) -> torch.Tensor:
    """Rope (neox pairing unless interleaved) on the first cos.shape[-1] dims of each head, the
    rest passed through."""
    r = cos.shape[-1]
    return torch.cat((_rope(x[..., :r], cos, sin, interleaved), x[..., r:]), dim=-1)


def _causal_attention(q, k, v, scale: float, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [T, H, Dq], k [T, H, Dq], v [T, H, Dv] -> [T, H*Dv]. keep [T, T] (optional): keys each
    query may attend to besides the causal rule (the DSA top-k)."""
    t = q.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    if keep is not None:
        mask = mask | ~keep
    scores = scores.masked_fill(mask, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out.reshape(t, -1)


class TinyForward:
    """forward(ids [T]) -> logits [T, vocab] (fp32), one sequence, causal, no cache."""

    def __init__(self, spec: TinySpec, weights: Dict[str, torch.Tensor],
                 linears: Optional[Linears] = None):
        self.s = spec
        self.w = weights
        self.lin = linears if linears is not None else Linears(weights)

    def _p(self, name):
        return self.w[name]

    # --- blocks
    def _qwen3_attention(self, p: str, h, cos, sin):
        s, lin = self.s, self.lin
        t = h.shape[0]
        q = lin(f"{p}.q_proj", h).view(t, s.heads, s.head_dim)
        k = lin(f"{p}.k_proj", h).view(t, s.kv_heads, s.head_dim)
        v = lin(f"{p}.v_proj", h).view(t, s.kv_heads, s.head_dim)
        q = _rope(_rms(q, self._p(f"{p}.q_norm.weight")), cos, sin, False)
        k = _rope(_rms(k, self._p(f"{p}.k_norm.weight")), cos, sin, False)
        rep = s.heads // s.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = _causal_attention(q, k, v, 1.0 / math.sqrt(s.head_dim))
        return lin(f"{p}.o_proj", o)

    def _glm4_attention(self, p: str, h, cos, sin):
        s, lin = self.s, self.lin
        t = h.shape[0]

        def proj(name, heads):
            y = lin(f"{p}.{name}", h) + self._p(f"{p}.{name}.bias").to(torch.float32)
            return y.view(t, heads, s.head_dim)

        q, k, v = proj("q_proj", s.heads), proj("k_proj", s.kv_heads), proj("v_proj", s.kv_heads)
        q, k = _partial_rope(q, cos, sin), _partial_rope(k, cos, sin)
        rep = s.heads // s.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = _causal_attention(q, k, v, 1.0 / math.sqrt(s.head_dim))
        return lin(f"{p}.o_proj", o)

    def _dsa_keep(self, p: str, h, qa, cos, sin) -> Optional[torch.Tensor]:
        """[T, T] keys each query keeps (its index_topk best by the indexer score), or None when
        every sequence position keeps all earlier keys (T <= index_topk)."""
        s, lin = self.s, self.lin
        t = h.shape[0]
        if t <= s.index_topk:
            return None
        q = lin(f"{p}.wq_b", qa).view(t, s.index_n_heads, s.index_head_dim)
        k = lin(f"{p}.wk", h)
        k = F.layer_norm(k, (s.index_head_dim,), self._p(f"{p}.k_norm.weight").to(torch.float32),
                         self._p(f"{p}.k_norm.bias").to(torch.float32), eps=EPS)
        q = _partial_rope(q, cos, sin, s.indexer_rope_interleave)
        k = _partial_rope(k.view(t, 1, s.index_head_dim), cos, sin, s.indexer_rope_interleave)[:, 0]
        scores = torch.einsum("qhd,kd->qhk", q, k).relu() * s.index_head_dim ** -0.5
        gates = lin(f"{p}.weights_proj", h) * s.index_n_heads ** -0.5
        index = torch.einsum("qh,qhk->qk", gates, scores)
        index = index.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        top = index.topk(s.index_topk, dim=-1).indices
        return torch.zeros(t, t, dtype=torch.bool).scatter_(1, top, True)

    def _mla_attention(self, p: str, h, cos, sin):
        s, lin = self.s, self.lin
        t = h.shape[0]
        qk = s.qk_nope_head_dim + s.qk_rope_head_dim
        keep = None
        if s.q_lora_rank:
            qa = _rms(lin(f"{p}.q_a_proj", h), self._p(f"{p}.q_a_layernorm.weight"))
            q = lin(f"{p}.q_b_proj", qa)
            if s.arch == "glm_moe_dsa":
                keep = self._dsa_keep(f"{p}.indexer", h, qa, cos, sin)
        else:
            q = lin(f"{p}.q_proj", h)
        q = q.view(t, s.heads, qk)
        q_nope, q_pe = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        kv_a = lin(f"{p}.kv_a_proj_with_mqa", h)
        c_kv, k_pe = kv_a.split([s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        c_kv = _rms(c_kv, self._p(f"{p}.kv_a_layernorm.weight"))
        kv = lin(f"{p}.kv_b_proj", c_kv).view(t, s.heads, s.qk_nope_head_dim + s.v_head_dim)
        k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        q_pe = _rope(q_pe, cos, sin, True)
        k_pe = _rope(k_pe.view(t, 1, s.qk_rope_head_dim), cos, sin, True).expand(-1, s.heads, -1)
        qf = torch.cat((q_nope, q_pe), dim=-1)
        kf = torch.cat((k_nope, k_pe), dim=-1)
        o = _causal_attention(qf, kf, v, 1.0 / math.sqrt(qk), keep)
        return lin(f"{p}.o_proj", o)

    def _mlp(self, p: str, h):
        lin = self.lin
        a = F.silu(lin(f"{p}.gate_proj", h)) * lin(f"{p}.up_proj", h)
        return lin(f"{p}.down_proj", a)

    def _route(self, p: str, h):
        """-> (topk ids [T, k], weights [T, k]) with each family's router semantics."""
        s = self.s
        logits = h @ self._p(f"{p}.gate.weight").to(torch.float32).t()
        if s.arch == "qwen3_moe":
            probs = logits.softmax(-1)
            w, ids = probs.topk(s.top_k, dim=-1)
            w = w / w.sum(-1, keepdim=True)  # norm_topk_prob
            return ids, w
        scores = logits.sigmoid()
        choice = scores + self._p(f"{p}.gate.e_score_correction_bias").to(torch.float32)
        ids = choice.topk(s.top_k, dim=-1).indices  # n_group = topk_group = 1
        w = scores.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * s.routed_scaling_factor
        return ids, w

    def _moe(self, p: str, h):
        ids, w = self._route(p, h)
        out = torch.zeros_like(h)
        for e in range(self.s.experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self._mlp(f"{p}.experts.{e}", h[tok])
            out.index_add_(0, tok, y * w[tok, slot, None])
        if self.s.arch in DEEPSEEK_MOE_ARCHS:
            out = out + self._mlp(f"{p}.shared_experts", h)
        return out

    # --- model
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        s = self.s
        ids = ids.reshape(-1).long()
        pos = torch.arange(ids.numel())
        cos, sin = _rope_cos_sin(pos, rotary_dim(s), rope_theta(s))
        x = self._p("model.embed_tokens.weight")[ids].to(torch.float32)
        for i in range(s.layers):
            p = f"model.layers.{i}"
            h = _rms(x, self._p(f"{p}.input_layernorm.weight"))
            if s.arch == "qwen3_moe":
                x = x + self._qwen3_attention(f"{p}.self_attn", h, cos, sin)
            elif s.arch == "glm4_moe":
                x = x + self._glm4_attention(f"{p}.self_attn", h, cos, sin)
            else:
                x = x + self._mla_attention(f"{p}.self_attn", h, cos, sin)
            h = _rms(x, self._p(f"{p}.post_attention_layernorm.weight"))
            if s.arch in DEEPSEEK_MOE_ARCHS and i < s.dense_layers:
                x = x + self._mlp(f"{p}.mlp", h)
            else:
                x = x + self._moe(f"{p}.mlp", h)
        x = _rms(x, self._p("model.norm.weight"))
        return self.lin("lm_head", x)


def greedy(fwd: Callable[[torch.Tensor], torch.Tensor], prompt, n_new: int) -> list:
    """Greedy continuation (recomputes the whole prefix per step: fine at these sizes)."""
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(fwd(torch.tensor(ids))[-1].argmax()))
    return ids[len(prompt):]
