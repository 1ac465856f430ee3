"""Shapes of the tiny models and the HF config.json each one gets.

Two families, both loaded by upstream sglang 0.5.16 without changes:

* ``qwen3_moe``  -> ``Qwen3MoeForCausalLM`` (GQA attention with q/k RMSNorm, softmax top-k MoE).
* ``deepseek_v2`` -> ``DeepseekV3ForCausalLM`` (sglang's ``models/deepseek_v2.py``): MLA attention
  with a q LoRA, DeepSeek-V3/GLM-5 style MoE (sigmoid scores, ``noaux_tc`` with an expert bias,
  one shared expert, first layer dense). This is GLM-5 without its DSA indexer.
* ``glm_moe_dsa`` -> ``GlmMoeDsaForCausalLM`` (GLM-5; sglang's ``models/glm4_moe.py`` subclasses
  the DeepSeek model): the ``deepseek_v2`` structure plus the DSA indexer on every layer (its own
  q projection from the q LoRA, one shared key with LayerNorm, per-head gate weights, top-k).
* ``glm4_moe`` -> ``Glm4MoeForCausalLM`` (GLM-4.5): GQA attention with q/k/v bias and rotary on
  half of each head (partial_rotary_factor 0.5, neox pairing), the same sigmoid ``noaux_tc``
  MoE with a shared expert, first layer dense.

Every dimension that an NVFP4 GEMM sees is a multiple of 128: the SM90 path upstream runs NVFP4
through Marlin (W4A16), which needs N % 64 == 0 and K % 128 == 0 (``marlin_utils.py``
GPTQ_MARLIN_MIN_THREAD_N/K); the SM120 CUTLASS paths pad N and K to 32.
MLA head dims are DeepSeek-V3's (kv_lora 512, rope 64, nope 128, v 128): Lk = 576 and
qk = 192 are the head sizes sglang's Triton MLA decode/extend kernels special-case, and the only
ones FlashInfer's MLA kernels are built for (FlashMLA's sparse kernels, used by the DSA backend,
need the same 576/512 latent layout).
DSA indexer: index_head_dim 128 and index_topk 2048 are GLM-5's values and the ones the kernels
are built for (DeepGEMM's FP8 MQA logits take head_dim 128; the fused top-k takes topk <= 2048);
index_n_heads 32 is GLM-5's. A sequence of at most index_topk tokens selects every earlier key,
so sparse attention equals dense attention there (the reference forward relies on it only as a
shortcut: it applies the top-k mask when a sequence is longer). FlashMLA pads query heads to a
multiple of 64 on SM90, so the head count must divide 64.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

ARCHS = ("qwen3_moe", "deepseek_v2", "glm_moe_dsa", "glm4_moe")
MLA_ARCHS = ("deepseek_v2", "glm_moe_dsa")          # MLA attention with a q LoRA
GQA_ARCHS = ("qwen3_moe", "glm4_moe")               # q/k/v/o projections
DEEPSEEK_MOE_ARCHS = ("deepseek_v2", "glm_moe_dsa", "glm4_moe")  # sigmoid noaux_tc, shared expert, dense first layers
QUANTS = ("bf16", "nvfp4")
GEMM_MULTIPLE = 128  # see module docstring
MIN_VOCAB = 512      # 256 byte symbols + specials + room for merges
MAX_VOCAB = 131072   # the built-in tokenizer corpus fills at least this many BPE tokens


@dataclass(frozen=True)
class TinySpec:
    arch: str
    quant: str = "bf16"
    seed: int = 0
    layers: int = 4
    hidden: int = 256
    experts: int = 16
    top_k: int = 4
    moe_intermediate: int = 256
    vocab: int = 4096
    heads: int = 8
    max_position: int = 4096
    # qwen3_moe
    kv_heads: int = 2
    head_dim: int = 64
    # deepseek_v2 (MLA + shared expert + leading dense layers)
    dense_layers: int = 1
    dense_intermediate: int = 512
    shared_experts: int = 1
    q_lora_rank: Optional[int] = 256
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    routed_scaling_factor: float = 2.5
    # glm_moe_dsa (DSA indexer)
    index_n_heads: int = 32
    index_head_dim: int = 128
    index_topk: int = 2048
    # RoPE pairing of the indexer's q/k (config key indexer_rope_interleave, which SGLang reads;
    # transformers' GlmMoeDsaIndexer hard-codes one pairing, which differs between its releases)
    indexer_rope_interleave: bool = False
    # glm4_moe
    partial_rotary_factor: float = 0.5

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.quant}-{self.seed}"

    def replace(self, **kw) -> "TinySpec":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def default_spec(arch: str, quant: str = "bf16", seed: int = 0, **overrides) -> TinySpec:
    """Default shapes per arch; `overrides` are TinySpec fields (None values are ignored)."""
    if arch not in ARCHS:
        raise ValueError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    base = dict(arch=arch, quant=quant, seed=seed)
    if arch == "qwen3_moe":
        base.update(layers=4, heads=8, kv_heads=2, head_dim=64)
    elif arch == "glm4_moe":
        base.update(layers=3, heads=4, kv_heads=2, head_dim=128, dense_layers=1,
                    routed_scaling_factor=1.0)
    else:
        base.update(layers=3, heads=4, dense_layers=1)
    base.update({k: v for k, v in overrides.items() if v is not None})
    spec = TinySpec(**base)
    validate(spec)
    return spec


def _need(cond: bool, option: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{option}: {msg}")


def validate(s: TinySpec) -> None:
    """Raise ValueError naming the offending option."""
    _need(s.arch in ARCHS, "--arch", f"must be one of {', '.join(ARCHS)}, got {s.arch!r}")
    _need(s.quant in QUANTS, "--quant", f"must be one of {', '.join(QUANTS)}, got {s.quant!r}")
    _need(isinstance(s.seed, int) and s.seed >= 0, "--seed", f"must be an integer >= 0, got {s.seed!r}")
    _need(1 <= s.layers <= 64, "--layers", f"must be in 1..64, got {s.layers}")
    for opt, v in (("--hidden", s.hidden), ("--moe-intermediate", s.moe_intermediate)):
        _need(v > 0 and v % GEMM_MULTIPLE == 0, opt,
              f"must be a positive multiple of {GEMM_MULTIPLE} (NVFP4 Marlin needs K % 128 == 0), got {v}")
    _need(s.experts >= 2, "--experts", f"must be >= 2, got {s.experts}")
    _need(1 <= s.top_k <= s.experts, "--top-k", f"must be in 1..experts ({s.experts}), got {s.top_k}")
    _need(MIN_VOCAB <= s.vocab <= MAX_VOCAB, "--vocab",
          f"must be in {MIN_VOCAB}..{MAX_VOCAB}, got {s.vocab}")
    _need(s.heads >= 1, "--heads", f"must be >= 1, got {s.heads}")
    if s.arch in GQA_ARCHS:
        _need(s.kv_heads >= 1 and s.heads % s.kv_heads == 0, "--heads",
              f"must be a multiple of kv_heads ({s.kv_heads}), got {s.heads}")
        _need(s.head_dim % 64 == 0, "head_dim", f"must be a multiple of 64, got {s.head_dim}")
        _need((s.heads * s.head_dim) % GEMM_MULTIPLE == 0, "--heads",
              f"heads * head_dim ({s.heads * s.head_dim}) must be a multiple of {GEMM_MULTIPLE} (o_proj K)")
    if s.arch == "glm4_moe":
        rot = s.head_dim * s.partial_rotary_factor
        _need(rot == int(rot) and int(rot) % 2 == 0, "partial_rotary_factor",
              f"head_dim * partial_rotary_factor must be an even integer, got {rot}")
    if s.arch == "glm_moe_dsa":
        _need(64 % s.heads == 0, "--heads",
              f"must divide 64 (FlashMLA pads query heads to 64 on SM90), got {s.heads}")
        _need(s.index_head_dim == 128, "index_head_dim", f"must be 128 (DeepGEMM MQA logits), got {s.index_head_dim}")
        _need(0 < s.index_topk <= 2048, "index_topk", f"must be in 1..2048 (DSA top-k kernels), got {s.index_topk}")
        _need(s.index_n_heads >= 1, "index_n_heads", f"must be >= 1, got {s.index_n_heads}")
        _need(s.index_head_dim > s.qk_rope_head_dim, "index_head_dim",
              f"must exceed qk_rope_head_dim ({s.qk_rope_head_dim}): the indexer ropes its first dims")
    if s.arch in DEEPSEEK_MOE_ARCHS:
        _need(0 <= s.dense_layers < s.layers, "dense_layers",
              f"must be in 0..layers-1 so at least one layer is MoE, got {s.dense_layers}")
        _need(s.dense_intermediate % GEMM_MULTIPLE == 0, "dense_intermediate",
              f"must be a multiple of {GEMM_MULTIPLE}, got {s.dense_intermediate}")
        _need(s.shared_experts >= 1, "shared_experts", f"must be >= 1, got {s.shared_experts}")
        # flashinfer's fused DeepSeek top-k (used by sglang when experts is a power of two) needs top_k <= 8
        _need(s.top_k <= 8, "--top-k", f"must be <= 8 for the DeepSeek router kernels, got {s.top_k}")


# ----------------------------------------------------------------------------- config.json

def hf_config(s: TinySpec, special_ids: dict) -> dict:
    """config.json contents. Keys follow the real checkpoints of each family (Qwen3-30B-A3B,
    DeepSeek-V3) so both transformers and sglang read them as they read those models."""
    common = {
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "max_position_embeddings": s.max_position,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": special_ids["bos"],
        "eos_token_id": special_ids["eos"],
        "pad_token_id": special_ids["pad"],
        "torch_dtype": "bfloat16",
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": s.moe_intermediate,
        "norm_topk_prob": True,
    }
    if s.arch == "qwen3_moe":
        cfg = {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "rope_theta": 1000000.0,
            "rope_scaling": None,
            "num_experts": s.experts,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            # dense MLP width; unused because every layer is MoE, but both loaders read it
            "intermediate_size": s.moe_intermediate * s.top_k,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": s.layers,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        }
    elif s.arch == "glm4_moe":
        cfg = {
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "num_key_value_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "partial_rotary_factor": s.partial_rotary_factor,
            "attention_bias": True,  # q/k/v carry a bias, o_proj does not (GLM-4.5)
            "use_qk_norm": False,
            **_deepseek_moe_keys(s),
            "rope_theta": rope_theta(s),
            "rope_scaling": None,
        }
    else:
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM" if s.arch == "deepseek_v2" else "GlmMoeDsaForCausalLM"],
            "model_type": "deepseek_v3" if s.arch == "deepseek_v2" else "glm_moe_dsa",
            "num_key_value_heads": s.heads,
            "q_lora_rank": s.q_lora_rank,
            "kv_lora_rank": s.kv_lora_rank,
            "qk_nope_head_dim": s.qk_nope_head_dim,
            "qk_rope_head_dim": s.qk_rope_head_dim,
            "v_head_dim": s.v_head_dim,
            **_deepseek_moe_keys(s),
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "rope_theta": rope_theta(s),
            "rope_scaling": None,
            "rope_interleave": True,
        }
        if s.arch == "glm_moe_dsa":
            cfg.update(index_n_heads=s.index_n_heads, index_head_dim=s.index_head_dim,
                       index_topk=s.index_topk, indexer_rope_interleave=s.indexer_rope_interleave)
    # arch keys win over the common ones (glm4_moe's attention_bias)
    out = dict(common)
    out.update(cfg)
    return dict(sorted(out.items()))


def rope_theta(s: TinySpec) -> float:
    """The rope_theta written to config.json (the reference forward uses the same)."""
    return {"qwen3_moe": 1000000.0, "glm4_moe": 1000000.0}.get(s.arch, 10000.0)


def rotary_dim(s: TinySpec) -> int:
    """Rotated dims per head: the rope part of MLA heads, half of glm4_moe's heads, all of qwen3's."""
    if s.arch in MLA_ARCHS:
        return s.qk_rope_head_dim
    if s.arch == "glm4_moe":
        return int(s.head_dim * s.partial_rotary_factor)
    return s.head_dim


def _deepseek_moe_keys(s: TinySpec) -> dict:
    """MoE keys shared by the DeepSeek-style families (sigmoid noaux_tc routing, one group)."""
    return {
        "intermediate_size": s.dense_intermediate,
        "first_k_dense_replace": s.dense_layers,
        "moe_layer_freq": 1,
        "n_routed_experts": s.experts,
        "n_shared_experts": s.shared_experts,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": s.routed_scaling_factor,
        "num_nextn_predict_layers": 0,
    }
